"""The Q8_0 weight codec: GGUF's block_q8_0 — d (fp16), 32 int8 quants: 34 bytes per 32 weights (blocks only 2-byte
aligned), w = q·d."""
from __future__ import annotations

from ..ir import Imm, Mem
from ._common import UnitScaleBlock, block_lanes, geometry, natural_words

FMT = "q8_0"
BLOCK_K, BLOCK_BYTES, D_OFFSET, QS_OFFSET = geometry(FMT, "d", "qs")  # 32, 34, 0, 2
GROUP_BLOCKS = 8  # a warp dequantizes 8 blocks (256 weights) at once
# of a lane's 8 values in the fp32 GEMVs, how many convert by I2F.S8 (one instruction, on the quarter-rate pipe);
# the rest by PRMT + FADD (two, full rate). Before 2026-12-03 all 8 took I2F and an FMUL by d (the pipe over the
# issue). H200, graph µs, T = 1: the MoE GEMV 128 x top-8 7.2 -> 7.1 at 4 (7.7 at 8, 7.0 at 0); the dense
# gemv_q8_0_f32_t1 on 4096x14336 26.8 at 4, 30.5 at 8 (bench/NOTES.md, 2026-12-03).
F32_I2F = 4
LOAD_ALIGN = 2
EXACT_ROUTES = ("codec_few", "codec_mma", "mmq_ra", "mmq_pre", "mmq_f16", "codec_gemv")
ROUTES = {"exact": EXACT_ROUTES, "fast": ("fast_lanes",) + EXACT_ROUTES}  # mul_mat's routes (runtime/ops.py)


def weights_error(mode: str, k: int, ptr: int) -> str | None:
    """Why mul_mat cannot take weights at device address `ptr` (K columns), or None. (mode="fast"'s int8 GEMV
    reads 4-byte words over pairs of blocks — GgmlLane's K_MULTIPLE, ALIGN —; weights it cannot take run the
    exact routes.)"""
    return f"q8_0 weights must start 2-byte aligned, pointer is {ptr:#x}" if ptr % 2 else None


def dequant_lane(b, w, group, lane, count, f32: bool = False):
    """dequantize_q8_0's step: lane L takes block 8·group + L / 4 (valid below `count` blocks) and its quants
    8·(L % 4) .. + 7 (four 2-byte loads: the block is 2-byte aligned); w = q·d in float32 as ggml, then fp16: one
    run of 4 f16x2 words. As q4_k.dequant_lane. f32 (the fp32 GEMVs, the fixup): one factored run (the 8 q as
    exact f32, d) — the GEMV sums q·x and scales once, the products of ggml's w = q·d (exact in f32: 11 + 8 bits) up
    to the sum's rounding; F32_I2F of the 8 values by I2F.S8, the rest by PRMT under 2^23 and one FADD."""
    b.comment("dequant q8_0: int8 pairs -> q·d -> fp16")
    blk, valid, offsets = block_lanes(b, group, lane, count, GROUP_BLOCKS)
    block = b.op("mad.wide.u32", blk, Imm(BLOCK_BYTES, "u32"), w)
    run = b.op("shl.b32", b.op("and.b32", lane, Imm(3, "b32")), Imm(3, "u32"))  # 8·(L % 4)
    qs = b.op("add.s64", block, b.op("cvt.u64.u32", run))
    dbits = b.reg("b16")
    b.emit("mov.b16", dbits, Imm(0, "b16"))
    b.emit("ld.global.nc.b16", dbits, Mem(block), pred=valid)
    d = b.op("cvt.f32.f16", dbits)
    words, vals = [], []
    for i in range(4):
        pair = b.op("mov.u32", Imm(0, "u32"))
        b.emit("ld.global.nc.u16", pair, Mem(qs, 2 + 2 * i), pred=valid)
        if f32:  # a factored run: q exactly as f32, d once per run
            u = b.op("xor.b32", pair, Imm(0x8080, "b32")) if 2 * i + 1 >= F32_I2F else None  # q + 128 a byte
            for j in range(2):
                if 2 * i + j < F32_I2F:
                    vals.append(b.op("cvt.rn.f32.s32", b.op("bfe.s32", pair, Imm(8 * j, "u32"), Imm(8, "u32"),
                                                                 type="s32")))
                else:  # 0x4B0000uu = 2^23 + q + 128, less 2^23 + 128: exact
                    v = b.op("prmt.b32", u, Imm(0x4B000000, "b32"), Imm(0x7650 + j, "b32"), type="f32")
                    vals.append(b.op("sub.rn.f32", v, Imm(8388736.0, "f32")))
            continue
        q = [b.op("bfe.s32", pair, Imm(8 * j, "u32"), Imm(8, "u32"), type="s32") for j in range(2)]
        v = [b.op("mul.rn.f32", b.op("cvt.rn.f32.s32", qj), d) for qj in q]
        words.append(b.op("cvt.rn.f16x2.f32", v[1], v[0], type="b32"))
    return ([(vals, d)] if f32 else [words]), offsets, valid


def run8(b, row, k0):
    """Weights k0 .. k0 + 7 of the row at `row` (k0 a multiple of 8): q·d in float32 as ggml (2-byte loads)."""
    block = b.op("mad.wide.u32", b.op("shr.u32", k0, Imm(5, "u32")), Imm(BLOCK_BYTES, "u32"), row)
    qs = b.op("add.s64", block, b.op("cvt.u64.u32", b.op("and.b32", k0, Imm(31, "b32"))))
    dbits = b.reg("b16")
    b.emit("ld.global.nc.b16", dbits, Mem(block))
    d = b.op("cvt.f32.f16", dbits)
    out = []
    for i in range(4):
        pair = b.op("ld.global.nc.u16", Mem(qs, 2 + 2 * i), type="u32")
        for j in range(2):
            q = b.op("bfe.s32", pair, Imm(8 * j, "u32"), Imm(8, "u32"), type="s32")
            out.append(b.op("mul.rn.f32", b.op("cvt.rn.f32.s32", q), d))
    return out


# The register-A wgmma MMQ (kernels/mmq.py, mmq_q8_0_wgmma_ra_n*): a K-step is 64 weights, two blocks, 68 bytes of a
# row. TMA boxes must start 16-byte aligned in the row, so a step's box starts at 64·s + 16·(s >> 2) (68·s rounded
# down to 16) and is RA_BOX_BYTES wide; the step's first block sits RA_BOX_BYTES-row offset 4·(s & 3) into it.
RA_BOX_BYTES = 80  # ≥ 12 + 68, a multiple of 16; 80-byte smem rows put rows g = 0..7 in distinct 16-byte bank groups
RA_BOX_NOTE = "K-step s's box from 64·s + 16·(s >> 2): its two blocks from byte 4·(s & 3)"
# ... or (RA_BOX_STEPS = 4) one box a 4-step block where the build keeps A slots (kernels/mmq.py _block_box): its 8
# blocks' RA_BLOCK_BOX_BYTES from 272·j (16-byte aligned; ra_box_column of the block's first step; a u32 map, as a box
# is at most 256 elements), step s reading it from its own box start, 64·(s & 3) in (ra_step_offset). One TMA of 272
# bytes a row a block instead of four of 80. Same bits; H200 graph µs, a box a step -> a block
# (probe_q8_0_block_box_4335826.log): 4096x14336 T = 16 / 64 33.3 / 32.8 -> 32.6 / 32.5, 14336x4096 T = 16 36.7 ->
# 34.2; MoE 128 x top-8 768x2048 T = 32 / 512 73.0 / 96.5 -> 67.3 / 91.4; but the dense n256 tile at T = 512 101.3 ->
# 102.0 and 97.8 -> 99.0, n128 at T = 96 / 128 40.5 / 42.1 -> 44.0 / 45.0, n256 at T = 256 60.8 -> 62.7, the grouped
# n128 at T = 2048 213.3 -> 215.5 (probe_q8_0_block_box_n128_3d39399.log; their 2 A slots hold 8 K-steps where the
# deep n64 build's 4 hold 16): so the tiles up to RA_BLOCK_BOX_MAX_BN (the converting builds keep a box a step).
RA_BOX_STEPS = 4
RA_BLOCK_BOX_BYTES = 8 * BLOCK_BYTES  # 272: 68-word smem rows, rows g = 0..7 in distinct 16-byte bank groups
RA_BLOCK_BOX_NOTE = "block j's 8 blocks, 68 words from word 68·j, shared by K-steps 4j .. 4j + 3: step s's from byte 68·(s & 3)"
RA_BLOCK_BOX_MAX_BN = 64
HALF_1152 = 0x64806480  # (1152, 1152) fp16: 1024 + q + 128 − 1152 = q


# The register-A GEMM's device layout "q8_0_ra" (the builds mmq_q8_0_wgmma_ra_n*_rp, MmqSpec.repacked; a copy made
# once a weight, kept beside the GGUF bytes: kernels/repack.py, runtime QuantTensor.device_layout): a
# row's 256-weight groups of 8 blocks as 288 bytes, 18 16-byte chunks: K-step st's 64 quant bytes in 4 chunks, each
# lane's 16 bytes whole (lane t of row g: chunk t of its step), and the group's 8 d's in a chunk at 4 and at 13, so
# that every step's 80-byte box (the raw build's box width) starts 16-byte aligned and holds its quants and d's:
# chunks [q0 q0 q0 q0 | d | q1 q1 q1 q1 | q2 q2 q2 q2 | d | q3 q3 q3 q3]; step st's box from chunk 0 / 4 / 9 / 13,
# its quants at 16·(st & 1) in it and its d's at 64 − 64·(st & 1). Quant byte 16t + 4·(2sb + wi) + (p + 2e) of step
# st is q[2st + sb][16wi + 8p + 2t + e] ^ 0x80 (q + 128): lane t's word (sb, wi) is natural_words' word (bytes 2t,
# 2t + 8, 2t + 1, 2t + 9 of the 16-quant half), biased already, so the decode loads a row's step with one
# ld.shared.v4 and its d pair with one ld.shared.b32 (the raw build: 8 two-byte loads, 4 prmt and 4 xor a row).
# x keeps its natural K order. 1.125 bytes a weight (raw: 1.0625).
RA_GROUP_BYTES = 288
RA_STEP_CHUNK = (0, 4, 9, 13)  # the 16-byte chunk where K-step st's box starts in its group
RA_D_CHUNKS = (4, 13)
RA_LAYOUT = "q8_0_ra"  # (the builds' meta weight_layout; runtime.tensors keeps the copy)
RA_QUANT_CHUNK = tuple(c + (st & 1) for st, c in enumerate(RA_STEP_CHUNK))  # (0, 5, 9, 14): a step's first quant chunk
# the PTX forms below (ra_box_column, _ra_fragments_repacked, kernels/repack.py) compute these tables arithmetically
assert [16 * c for c in RA_STEP_CHUNK] == [64 * st + 16 * (st >> 1) for st in range(4)]
assert all(RA_STEP_CHUNK[st] + 4 * (1 - (st & 1)) == RA_D_CHUNKS[st >> 1] for st in range(4))  # d 64 − 64·(st & 1) in


def ra_row_bytes(k: int) -> int:
    """A row of K weights (K a multiple of 256) in the layout q8_0_ra."""
    return k // 256 * RA_GROUP_BYTES


def _ra_source():
    """For each byte of a 288-byte group: its source byte in the raw 272-byte group (8 blocks) and whether it is a
    quant (then stored XOR 0x80)."""
    import numpy as np

    src, quant = np.zeros(RA_GROUP_BYTES, np.int64), np.zeros(RA_GROUP_BYTES, bool)
    for c in RA_D_CHUNKS:  # the group's 8 d's, fp16 bytes as stored
        for blk in range(8):
            src[16 * c + 2 * blk: 16 * c + 2 * blk + 2] = BLOCK_BYTES * blk + D_OFFSET + np.arange(2)
    for st, c0 in enumerate(RA_STEP_CHUNK):
        q0 = 16 * c0 + (16 if st & 1 else 0)  # the step's quants in its box
        for t in range(4):
            for sb in range(2):
                for wi in range(2):
                    for p in range(2):
                        for e in range(2):
                            at = q0 + 16 * t + 4 * (2 * sb + wi) + p + 2 * e
                            src[at] = BLOCK_BYTES * (2 * st + sb) + QS_OFFSET + 16 * wi + 8 * p + 2 * t + e
                            quant[at] = True
    return src, quant


def repack_ra(raw, rows: int, k: int):
    """The GGUF bytes of `rows` rows of K weights (K a multiple of 256) in the layout q8_0_ra (NumPy uint8)."""
    import numpy as np

    if k % 256:
        raise ValueError(f"q8_0_ra: K = {k} is not a multiple of 256")
    src, quant = _ra_source()
    g = np.asarray(raw, np.uint8).reshape(rows * (k // 256), 8 * BLOCK_BYTES)
    out = g[:, src]
    out[:, quant] ^= 0x80
    return out.reshape(-1)


def unpack_ra(packed, rows: int, k: int):
    """repack_ra's inverse: the GGUF bytes back (each byte of a raw group is stored once or, the d's, twice alike)."""
    import numpy as np

    src, quant = _ra_source()
    g = np.asarray(packed, np.uint8).reshape(rows * (k // 256), RA_GROUP_BYTES).copy()
    g[:, quant] ^= 0x80
    out = np.empty((g.shape[0], 8 * BLOCK_BYTES), np.uint8)
    out[:, src] = g  # (the d chunks' two copies write the same bytes)
    return out.reshape(-1)


def ra_box_column(b, s, repacked: bool = False):
    """K-step s's TMA box start in the row, bytes: 68·s rounded down to a multiple of 16; `repacked` (q8_0_ra):
    chunk RA_STEP_CHUNK[s & 3] of group s >> 2, 288·(s >> 2) + 64·(s & 3) + 16·((s & 3) >> 1)."""
    if repacked:
        st = b.op("and.b32", s, Imm(3, "b32"))
        return b.op("add.u32", b.op("mul.lo.u32", b.op("shr.u32", s, Imm(2, "u32")), Imm(RA_GROUP_BYTES, "u32")),
                    b.op("add.u32", b.op("shl.b32", st, Imm(6, "u32")),
                         b.op("shl.b32", b.op("shr.u32", st, Imm(1, "u32")), Imm(4, "u32"))))
    return b.op("add.u32", b.op("shl.b32", s, Imm(6, "u32")), b.op("shl.b32", b.op("shr.u32", s, Imm(2, "u32")),
                                                                   Imm(4, "u32")))


def ra_step_offset(b, s):
    """With a box a block: where K-step s's own box start (ra_fragments' rbase) sits in it, bytes: 64·(s & 3)."""
    return b.op("shl.b32", b.op("and.b32", s, Imm(3, "b32")), Imm(6, "u32"))


def ra_fragments(b, rbase, row_offs, s, t, natural: bool = False, repacked: bool = False):
    """One K-step's register-A fragments from its TMA box (rows at rbase + row_offs[rr], the build's pitch: a step's
    RA_BOX_BYTES or a block's RA_BLOCK_BOX_BYTES, rbase then at the step's ra_step_offset in it): lane
    (g, t) takes quants 8t .. 8t + 7 of both blocks of its rows g and g + 8 — the positions q4_k's register-A
    decode gives its nibbles (block sb in the place of sub-block 2c + sb, element e in the place of qs byte e), so
    the activation keeps layouts.q4k_rega_k_order. A pair of quants (e, e + 2) becomes (1152 + q) halves by one
    prmt against 0x64 (after the sign bit is flipped), then (h − 1152)·d: q exact, then one rounding, fp16(q·d) —
    ggml's float32 q·d rounded once, as the prepared fragments hold it. Returns the 4 k16 slices' A registers.
    `natural` (x in its own K order, kernels/mmq.py RA_NATURAL_FORMATS): quants 2t, 2t + 1 of each 8 of a block
    instead — as q4_k.RegA's natural words (two 2-byte loads and a prmt a word), the decode after them the same.
    `repacked` (natural order, boxes of the layout q8_0_ra): a row's 4 words by one ld.shared.v4 at 16t past the
    step's quants, its d pair by one ld.shared.b32, no xor."""
    if repacked:
        return _ra_fragments_repacked(b, rbase, row_offs, s, t)
    o = b.op("shl.b32", b.op("and.b32", s, Imm(3, "b32")), Imm(2, "u32"))  # the step's first block in the box
    t8 = b.op("shl.b32", t, Imm(1 if natural else 3, "u32"))  # (natural: 2t)
    c64, c1152 = b.op("mov.b32", Imm(0x64646464, "b32")), b.op("mov.b32", Imm(HALF_1152, "b32"))
    frag = {}
    for rr, roff in enumerate(row_offs):
        base = b.op("add.u32", b.op("add.u32", rbase, roff), o)  # 4-byte aligned: the first block's d
        words = [[], []]
        if natural:  # block sb's quants from base + 34·sb + 2: bytes (2t, 2t + 8, 2t + 1, 2t + 9) of each 16
            q = b.op("add.u32", base, t8)
            words = [natural_words(b, q, 34 * sb + 2) for sb in range(2)]
        else:
            w0 = [b.op("ld.shared.u32", Mem(b.op("add.u32", base, t8), 4 * i)) for i in range(3)]  # bytes 0..11 past 8t
            words[0] = [b.op("prmt.b32", w0[i], w0[i + 1], Imm(0x5432, "b32")) for i in range(2)]  # quants at 2 + 8t
            q1 = b.op("add.u32", base, b.op("add.u32", t8, Imm(36, "u32")))  # the second block's quants, 4-aligned
            words[1] = [b.op("ld.shared.u32", Mem(q1, 4 * i)) for i in range(2)]
        for sb in range(2):
            dh = b.reg("b16")
            b.emit("ld.shared.b16", dh, Mem(base, 34 * sb))
            dd = b.op("mov.b32", b.vec([dh, dh]), type="b32")
            for wi, wv in enumerate(words[sb]):
                u = b.op("xor.b32", wv, Imm(0x80808080, "b32"))  # q + 128 in each byte
                for sh in range(2):  # bytes (0, 2) or (1, 3): quants 8t + 4wi + sh and + 2
                    h = b.op("prmt.b32", u, c64, Imm(0x4240 + 0x101 * sh, "b32"))
                    q = b.op("sub.rn.f16x2", h, c1152, type="b32")
                    frag[rr, 4 * sb + 2 * wi + sh] = b.op("mul.rn.f16x2", q, dd, type="b32")
    return [[frag[0, 2 * kk], frag[1, 2 * kk], frag[0, 2 * kk + 1], frag[1, 2 * kk + 1]] for kk in range(4)]


def _ra_fragments_repacked(b, rbase, row_offs, s, t):
    """ra_fragments on the layout q8_0_ra (the _rp builds): step s's box at rbase, its quants 16·(s & 1) in, its d's
    (the group's 8, word s & 3 the step's pair) 64 − 64·(s & 1) in."""
    odd = b.op("and.b32", s, Imm(1, "b32"))
    qo = b.op("add.u32", b.op("shl.b32", odd, Imm(4, "u32")), b.op("shl.b32", t, Imm(4, "u32")))
    do = b.op("sub.u32", Imm(64, "u32"), b.op("shl.b32", odd, Imm(6, "u32")))
    do = b.op("add.u32", do, b.op("shl.b32", b.op("and.b32", s, Imm(3, "b32")), Imm(2, "u32")))
    c64, c1152 = b.op("mov.b32", Imm(0x64646464, "b32")), b.op("mov.b32", Imm(HALF_1152, "b32"))
    frag = {}
    for rr, roff in enumerate(row_offs):
        row = b.op("add.u32", rbase, roff)
        words = [b.reg("b32") for _ in range(4)]  # (sb, wi) = (0, 0), (0, 1), (1, 0), (1, 1)
        b.emit("ld.shared.v4.b32", b.vec(words), Mem(b.op("add.u32", row, qo)))
        dw = b.op("ld.shared.b32", Mem(b.op("add.u32", row, do)))
        dl, dh = b.reg("b16"), b.reg("b16")
        b.emit("mov.b32", b.vec([dl, dh]), dw)
        for sb, d in enumerate((dl, dh)):
            dd = b.op("mov.b32", b.vec([d, d]), type="b32")
            for wi in range(2):
                for sh in range(2):  # bytes (0, 2) or (1, 3): quants 16wi + 2t (+ 1) and + 8
                    h = b.op("prmt.b32", words[2 * sb + wi], c64, Imm(0x4240 + 0x101 * sh, "b32"))
                    q = b.op("sub.rn.f16x2", h, c1152, type="b32")
                    frag[rr, 4 * sb + 2 * wi + sh] = b.op("mul.rn.f16x2", q, dd, type="b32")
    return [[frag[0, 2 * kk], frag[1, 2 * kk], frag[0, 2 * kk + 1], frag[1, 2 * kk + 1]] for kk in range(4)]


# --- the tensor-core decode GEMV (kernels/gemv_mma_codec.py) ---------------------------------------------------------
MMA_STEP_BYTES = 8 * BLOCK_BYTES  # 272 bytes per 256 weights: a 16-byte multiple, so every step starts aligned
MMA_BOX_BYTES = MMA_STEP_BYTES
MMA_SLOT_BYTES = 304  # 76 words a row: rows g = 0..7 in distinct banks
MMA_SCALE_SUBBLOCKS = 2  # mma_block's 16-element sub-blocks that share a scale (a block's d): their MMAs chain


def mma_constants(b) -> dict:
    """The constants mma_block's decode uses, in registers once per kernel."""
    c = {"magic": 0x64006400, "n1152": 0xE480E480}
    return {k: b.op("mov.b32", Imm(v, "b32")) for k, v in c.items()}


class mma_block(UnitScaleBlock):  # noqa: N801 - a codec hook, named as the others
    """One row's 8 blocks (a step of 256 weights) for the tensor-core GEMV, as q6_k.mma_block: `fragment(s)` — the
    A pairs (elements 4t, 4t + 1), (4t + 2, 4t + 3) of 16-element half s % 2 of block s // 2 as f16x2 of q (exact:
    each int8 byte + 128 beside 0x64 by a prmt, then h − 1152) — `scale(s)`, that block's d as f32, and `d` = 1."""

    def fragment(self, s):
        b, c = self.b, self.c
        j, h = s // 2, s % 2
        x = b.op("xor.b32", self.word(j * BLOCK_BYTES + QS_OFFSET + 16 * h, True), Imm(0x80808080, "b32"))
        return [b.op("add.rn.f16x2", b.op("prmt.b32", x, c["magic"], Imm(sel, "b32")), c["n1152"], type="b32")
                for sel in (0x5150, 0x5352)]  # bytes (0, 1), (2, 3) beside 0x64

    def scale(self, s):
        j = s // 2
        if j not in self._d:
            self._d[j] = self.b.op("cvt.f32.f16", self.half(j * BLOCK_BYTES + D_OFFSET))
        return self._d[j]


class I8Block(UnitScaleBlock):
    """One row's 8 blocks (a step of 256 weights) for the int8 few-token GEMVs (gemv_t1._I8Q8Step, on prep_q6k_i8's
    digit planes in the natural K order): `a(s)` — lane t's int8 elements 4t .. 4t + 3 of 16-element half s % 2 of
    block s // 2 as they lie, the A register of m16n8k16 s8 x s8 for this row (no decode at all) — and `scale(s)`,
    that block's d as f32."""
    PER_BLOCK_SCALE = True  # (gemv_t1: the fp16 scale a block applied in fp32 after each block's MMAs)

    @staticmethod
    def constants(b):
        return None

    def a(self, s):
        return self.word((s // 2) * BLOCK_BYTES + QS_OFFSET + 16 * (s % 2), True)

    def scale(self, s):
        j = s // 2
        if j not in self._d:
            self._d[j] = self.b.op("cvt.f32.f16", self.half(j * BLOCK_BYTES + D_OFFSET))
        return self._d[j]


class GgmlLane:
    """Q8_0 in kernels/gemv.py's MMVQ-style lane GEMV (build_lanes_ggml: gemv_q8_0_t*, int8 x Q8_1 with dp4a, as
    llama.cpp's MMVQ): a lane owns one 34-byte block (2-byte aligned): it loads the 9 words covering it from the
    4-byte boundary below (K a multiple of 64 keeps them inside the row) and one prmt per word realigns the 32
    int8 values whichever parity the block has."""
    ROWS = 2
    WORDS = 9
    K_MULTIPLE, LANE_COLS = 64, 32
    ALIGN = 4  # (the weights' pointer: mul_mat runs the exact routes for others)
    EXACT = False  # int8 x Q8_1 only (its exact decode is the codec GEMV's)

    @staticmethod
    def sizes(b, K, nblk):
        """(units a row: blocks, row bytes)."""
        return nblk, b.op("mul.lo.u32", nblk, Imm(BLOCK_BYTES, "u32"))

    def __init__(self, b, lane):
        self.lane = lane
        odd = b.op("and.b32", lane, Imm(1, "b32"))  # block parity = lane parity (jb is a multiple of 32)
        # qs word i = bytes 2..5 of the window (even block) or word i+1 (odd block): prmt(w_i, w_i+1, sel)
        self.wsel = b.op("selp.b32", Imm(0x7654, "b32"), Imm(0x5432, "b32"), b.op("setp.ne.u32", odd, Imm(0, "u32")))
        self.dsel = b.op("selp.b32", Imm(0x32, "b32"), Imm(0x10, "b32"), b.op("setp.ne.u32", odd, Imm(0, "u32")))

    def load(self, b, u, rowptr, regs, pred):
        """Block u of a row: the 9 words from the 4-byte boundary at or below its start."""
        off = b.op("and.b32", b.op("mul.lo.u32", u, Imm(BLOCK_BYTES, "u32")), Imm(~3 & 0xFFFFFFFF, "b32"))
        p = b.op("add.s64", rowptr, b.op("cvt.u64.u32", off))
        for i, reg in enumerate(regs):
            b.emit("ld.global.nc.u32", reg, Mem(p, 4 * i), pred=pred)

    def act(self, b, u, actptr, gsize, pred, tail):
        """A token's Q8_1 activation of block u: its qs words (8) and d."""
        g = b.op("mul.wide.u32", b.op("shr.u32", u, Imm(5, "u32")), Imm(gsize, "u32"))
        base = b.op("add.s64", b.op("add.s64", actptr, g), b.op("mul.wide.u32", self.lane, Imm(16, "u32")))
        wv = b.regs("b32", 8)
        if tail:
            for reg in wv:
                b.emit("mov.b32", reg, Imm(0, "b32"))
        b.emit("ld.global.nc.v4.u32", b.vec(wv[0:4]), Mem(base), pred=pred)
        b.emit("ld.global.nc.v4.u32", b.vec(wv[4:8]), Mem(base, 512), pred=pred)
        dv = b.reg("f32")
        if tail:
            b.emit("mov.f32", dv, Imm(0.0, "f32"))
        b.emit("ld.global.nc.f32", dv, Mem(b.op("sub.s64", base, b.op("mul.wide.u32", self.lane, Imm(12, "u32"))), 1024),
               pred=pred)
        return [wv], [dv]

    def compute(self, b, u, ws, acts, acc, ones):
        """dp4a over block u of each row `ws[r]` and token (acts[t] = act()), into acc[r][t]."""
        for r, regs in enumerate(ws):
            d = b.op("cvt.f32.f16", b.op("cvt.u16.u32", b.op("prmt.b32", regs[0], Imm(0, "b32"), self.dsel)))
            qw = [b.op("prmt.b32", regs[i], regs[i + 1], self.wsel) for i in range(8)]
            for t in range(len(acts)):
                wv, dv = acts[t][0][0], acts[t][1][0]
                s_ = Imm(0, "s32")
                for i in range(8):
                    s_ = b.op("dp4a.s32.s32", qw[i], wv[i], s_, type="s32")
                b.emit("fma.rn.f32", acc[r][t], b.op("mul.rn.f32", d, dv), b.op("cvt.rn.f32.s32", s_), acc[r][t])
