"""What several codecs share."""
from __future__ import annotations

from .. import formats
from ..ir import Imm, Mem


def geometry(fmt: str, *fields: str) -> tuple[int, ...]:
    """(weights per block, bytes per block, then the byte offset of each of `fields` in the block), from the
    format's GGUF record (ptxgen.formats): a codec states none of them twice."""
    f = formats.get(fmt)
    return (f.block_size, f.block_bytes, *(f.dtype.fields[name][1] for name in fields))


def alignment_error(fmt: str, align: int):
    """A codec's `weights_error` that asks only for `align`-byte aligned weights (its kernels' widest load)."""
    def weights_error(mode: str, k: int, ptr: int) -> str | None:
        """Why mul_mat cannot take weights at device address `ptr` (K columns), or None."""
        return f"{fmt} weights must start {align}-byte aligned, pointer is {ptr:#x}" if ptr % align else None
    return weights_error


def row_bytes(b, codec, K):
    """A weight row of K columns in `codec`'s blocks, in bytes: K / BLOCK_K blocks of BLOCK_BYTES (a register)."""
    return b.op("mul.lo.u32", b.op("div.u32", K, Imm(codec.BLOCK_K, "u32")), Imm(codec.BLOCK_BYTES, "u32"))


def block_lanes(b, group, lane, count, group_blocks: int):
    """The 32-weight-block codecs' warp step (Q8_0, TQ4_1S dequant_lane): lane L takes block
    group_blocks·group + L / 4, valid below `count` blocks, and its elements 8·(L % 4) .. + 7. Returns (block,
    valid, offsets) with offsets() the dequant_lane contract's (first element, (0,)): 256·group + 8·L."""
    blk = b.op("mad.lo.u32", group, Imm(group_blocks, "u32"), b.op("shr.u32", lane, Imm(2, "u32")))
    valid = None if count is None else b.op("setp.lt.u32", blk, count)  # None: the caller knows the group is whole

    def offsets():  # element 32·block + 8·(L % 4) = 256·group + 8·L
        return b.op("add.u32", b.op("shl.b32", group, Imm(8, "u32")), b.op("shl.b32", lane, Imm(3, "u32"))), (0,)
    return blk, valid, offsets


# kquant_lane_wide's values to f32 by one PRMT under the exponent of 2^23 and one FADD (full-rate pipes, as Q6_K's
# lanes) instead of I2F.U8 (a quarter-rate conversion: 64 a step in the MoE pair GEMV, its pipe busier than the issue);
# the same bits. MoE T = 1, 128 x top-8 / 32 x top-4, graph µs on the H200 with the FFMA weights and Q4_K at 3 CTAs an
# SM (bench/NOTES.md, 2026-12-03): Q4_K 7.1 / 8.7 (I2F) -> 6.4 / 7.7, Q5_K 7.8 / 9.1 -> 7.2 / 8.6. False: I2F.
PRMT_CONVERT = True


def _byte_f32(b, q, i: int):
    """Byte i of the u32 `q` (a value 0 .. 255) as an exact f32."""
    if PRMT_CONVERT:  # 0x4B0000qq = 2^23 + q, less 2^23: exact
        v = b.op("prmt.b32", q, Imm(0x4B000000, "b32"), Imm(0x7650 + i, "b32"), type="f32")
        return b.op("sub.rn.f32", v, Imm(8388608.0, "f32"))
    return b.op("cvt.rn.f32.u32", b.op("bfe.u32", q, Imm(8 * i, "u32"), Imm(8, "u32")))


def kquant_lane_wide(b, w, group, lane, count, *, fmt: str, block_bytes: int, qs_offset: int, qh_offset=None):
    """The GEMVs' wider step for the K-quants with 6-bit (scale, min) pairs, Q4_K and Q5_K (`qh_offset`: Q5_K's
    fifth bits): lane L takes block 2·group + L / 16 (valid below `count`; past it the qs / qh loads are off, the
    header is the row's last block's, and the GEMV masks x), chunk c = (L / 4) % 4 and bytes l0 .. l0 + 7
    (l0 = 8·(L % 4)) of its 32 qs bytes: 8 weights of sub-block 2c (low nibbles) and 8 of 2c + 1 (high), from one
    8-byte qs load (and one of qh), with one header load and the two sub-blocks' scale decode for 16 weights. The
    weights are ggml's fp32 w = d·sc·q − dmin·m, each rounded as ggml rounds it: d·sc·q is exact in f32, so one FFMA
    gives ggml's FMUL-then-FADD bits (not factored: with the min term a factored sum d·sc·Σqx − dmin·m·Σx can
    cancel). Offsets as dequant_lane's, the first element 256·block + 64·c
    + l0, the high run 32 further."""
    from ..dsl import DequantSequence, LoadWords
    from . import q4_k

    blk = b.op("add.u32", b.op("shl.b32", group, Imm(1, "u32")), b.op("shr.u32", lane, Imm(4, "u32")))
    if count is None:  # the caller knows both blocks lie inside the row: no predicates, no clamp
        valid, block = None, b.op("mad.wide.u32", blk, Imm(block_bytes, "u32"), w)
    else:
        valid = b.op("setp.lt.u32", blk, count)
        block = b.op("mad.wide.u32", b.op("min.u32", blk, b.op("sub.u32", count, Imm(1, "u32"))), Imm(block_bytes, "u32"),
                     w)
    c = b.op("and.b32", b.op("shr.u32", lane, Imm(2, "u32")), Imm(3, "b32"))
    l0 = b.op("shl.b32", b.op("and.b32", lane, Imm(3, "b32")), Imm(3, "u32"))
    sub_lo = b.op("shl.b32", c, Imm(1, "u32"))
    env = {"block": block, "sub_lo": sub_lo, "sub_hi": b.op("add.u32", sub_lo, Imm(1, "u32"))}
    DequantSequence(fmt, (LoadWords("hdr", 0, 4), *q4_k.scale_ops())).lower(b, env)

    def pair(offset):  # 8 bytes: qs (or qh) bytes l0 .. l0 + 7 of the lane's chunk (zero past the row)
        words = [b.op("mov.u32", Imm(0, "u32")) for _ in range(2)]
        b.emit("ld.global.nc.v2.u32", b.vec(words), Mem(b.op("add.s64", block, b.op("cvt.u64.u32", offset))), pred=valid)
        return words
    qs = pair(b.op("add.u32", b.op("mad.lo.u32", c, Imm(32, "u32"), l0), Imm(qs_offset, "u32")))
    qh = pair(b.op("add.u32", l0, Imm(qh_offset, "u32"))) if qh_offset is not None else None
    runs = []
    for half, sub, scale, minimum in ((0, sub_lo, "d_lo", "min_lo"), (1, env["sub_hi"], "d_hi", "min_hi")):
        vals = []
        neg = b.op("neg.f32", env[minimum])  # d·sc·q is exact in f32 (11 + 6 + 5 bits): one FFMA, ggml's bits
        for wd in range(2):
            q = b.op("and.b32", qs[wd] if half == 0 else b.op("shr.u32", qs[wd], Imm(4, "u32")), Imm(0x0F0F0F0F, "b32"))
            if qh is not None:  # bit `sub` of each qh byte is the fifth bit
                q = b.op("or.b32", q, b.op("shl.b32", b.op("and.b32", b.op("shr.u32", qh[wd], sub),
                                                           Imm(0x01010101, "b32")), Imm(4, "u32")))
            vals += [b.op("fma.rn.f32", env[scale], _byte_f32(b, q, i), neg) for i in range(4)]
        runs.append(vals)

    def offsets():  # 256·block + 64·c + l0; the high run 32 further
        return b.op("add.u32", b.op("shl.b32", blk, Imm(8, "u32")), b.op("mad.lo.u32", c, Imm(64, "u32"), l0)), (0, 32)
    return runs, offsets, valid


class UnitScaleBlock:
    """The base of the mma_block hooks (kernels/gemv_t1.py _CodecStep) of the codecs whose 256-weight step has no
    super-block scale (Q8_0, TQ4_1S): the readers and constants kept, `d` = 1, `_d` the scales decoded so far."""

    def __init__(self, b, word, half, t, c):
        self.b, self.word, self.half, self.c, self._d = b, word, half, c, {}
        self.d = b.op("mov.f32", Imm(1.0, "f32"))


def natural_words(b, at, offset: int = 0, stride: int = 16) -> list:
    """The two A words of a row's quant bytes in x's natural K order (the register-A GEMMs' RA_NATURAL_FORMATS
    builds): `at` the lane's byte 2t; word wi = bytes (2t, 2t + 8, 2t + 1, 2t + 9) of the 16 at offset + stride·wi,
    so the decode's byte pairs (0, 2) and (1, 3) are columns (2t, 2t + 1) and (2t + 8, 2t + 9) — where wgmma's A
    fragment wants them. Two 2-byte loads and a prmt a word."""
    return [b.op("prmt.b32", *(b.op("ld.shared.u16", Mem(at, offset + stride * wi + 8 * e), type="u32")
                               for e in range(2)), Imm(0x5140, "b32")) for wi in range(2)]
