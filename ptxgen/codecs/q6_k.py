"""The Q6_K weight codec: GGUF's block_q6_K — ql[128] (low 4 bits), qh[64] (high 2 bits), 16 int8 scales (one per
16 weights), d (fp16): 210 bytes per 256 weights (blocks only 2-byte aligned), w = d·sc·(q − 32) with q 6 bits.
Each 128-weight half takes ql[64·h ...], qh[32·h ...], scales[8·h ...]; element 32·k + l of a half is
ql[l + 32·(k & 1)] (low nibble for k < 2, high for k ≥ 2) with bits 2k, 2k + 1 of qh[l] above them."""
from __future__ import annotations

from ..ir import Imm, Mem
from ._common import alignment_error, geometry

FMT = "q6_K"
BLOCK_K, BLOCK_BYTES, QL_OFFSET, QH_OFFSET, SC_OFFSET, D_OFFSET = geometry(FMT, "ql", "qh", "scales", "d")
GROUP_BLOCKS = 1
LOAD_ALIGN = 2
ROUTES = {"exact": ("mmq_pre", "codec_gemv")}  # mul_mat's routes (runtime/ops.py) per mode
weights_error = alignment_error(FMT, LOAD_ALIGN)


def dequant_lane(b, w, group, lane, count, f32: bool = False):
    """dequantize_q6_k's step: lane L takes half h = L / 16 and elements l, l + 1 (l = 2·(L % 16)) of each of its 4
    quarters (2-byte loads: the block is 2-byte aligned); w = (d·sc)·(q − 32) in float32 as ggml, then fp16: 4 runs
    of one f16x2 word each (f32: of two f32 values). As q4_k.dequant_lane."""
    b.comment("dequant q6_K: ql, qh pairs -> 6-bit q - 32 -> (d·sc)·q -> fp16")
    block = b.op("mad.wide.u32", group, Imm(BLOCK_BYTES, "u32"), w)
    h = b.op("shr.u32", lane, Imm(4, "u32"))
    l0 = b.op("shl.b32", b.op("and.b32", lane, Imm(15, "b32")), Imm(1, "u32"))
    ql = b.op("add.s64", block, b.op("cvt.u64.u32", b.op("mad.lo.u32", h, Imm(64, "u32"), l0)))
    qh = b.op("add.s64", block, b.op("cvt.u64.u32", b.op("mad.lo.u32", h, Imm(32, "u32"), l0)))
    sc_at = b.op("add.s64", block, b.op("cvt.u64.u32", b.op("mad.lo.u32", h, Imm(8, "u32"),
                                                              b.op("shr.u32", l0, Imm(4, "u32")))))
    a = b.op("ld.global.nc.u16", Mem(ql, QL_OFFSET), type="u32")
    a2 = b.op("ld.global.nc.u16", Mem(ql, QL_OFFSET + 32), type="u32")
    hq = b.op("ld.global.nc.u16", Mem(qh, QH_OFFSET), type="u32")
    dbits = b.reg("b16")
    b.emit("ld.global.nc.b16", dbits, Mem(block, D_OFFSET))
    d = b.op("cvt.f32.f16", dbits)
    runs = []
    for k in range(4):  # quarter k: low nibbles of ql[l] (k = 0), ql[l + 32] (1), high of ql[l] (2), ql[l + 32] (3)
        sc = b.op("cvt.rn.f32.s32", b.op("ld.global.nc.s8", Mem(sc_at, SC_OFFSET + 2 * k), type="s32"))
        ds = b.op("mul.rn.f32", d, sc)
        src = a if k % 2 == 0 else a2
        vals = []
        for j in range(2):  # elements l, l + 1: byte j of the 2-byte loads
            lo = b.op("bfe.u32", src, Imm(8 * j + 4 * (k // 2), "u32"), Imm(4, "u32"))
            hi = b.op("bfe.u32", hq, Imm(8 * j + 2 * k, "u32"), Imm(2, "u32"))
            q = b.op("sub.s32", b.op("or.b32", lo, b.op("shl.b32", hi, Imm(4, "u32"))), Imm(32, "s32"), type="s32")
            vals.append(b.op("mul.rn.f32", ds, b.op("cvt.rn.f32.s32", q)))
        runs.append(vals if f32 else [b.op("cvt.rn.f16x2.f32", vals[1], vals[0], type="b32")])

    def offsets():  # element 256·group + 128·h + 32·k + l of quarter k
        return b.op("add.u32", b.op("shl.b32", group, Imm(8, "u32")), b.op("mad.lo.u32", h, Imm(128, "u32"), l0)), \
            (0, 32, 64, 96)
    return runs, offsets, None


WIDE_BLOCKS = 2  # dequant_lane_wide: a warp step covers 2 blocks, 16 weights a lane


def dequant_lane_wide(b, w, group, lane, count, f32: bool = True):
    """The GEMVs' wider step (kernels/gemv_codec.py): lane L takes block 2·group + L / 16 (valid below `count`;
    past it every load is off: a zero scale, and the GEMV masks x), half h = (L / 8) % 2 and elements l0 .. l0 + 3 (l0 = 4·(L % 8))
    of all 4 quarters: 16 weights from two 4-byte ql words and one qh word (each from two 2-byte loads: the block is
    2-byte aligned) and the quarters' 4 scales. Four weights' q − 32 at a time: (low nibbles | high bits << 4) ^ 0x20
    per byte is q − 32 as a 6-bit two's complement; shifted left by 2 each byte is the int8 4·(q − 32), which one
    I2F.S8 converts (ptxas folds the byte extract into it). Returns factored runs — per quarter (the 4 values
    4·(q − 32) as f32, the scale d·sc / 4) — so the GEMV sums q·x first and scales once per quarter: the same
    products as ggml's fp32 weights times x up to fp32 rounding (~1e-7 relative), at 2 instructions a weight. Offsets
    as dequant_lane's, the first element 256·block + 128·h + l0."""
    if not f32:
        raise ValueError("q6_K dequant_lane_wide gives float32 runs only (the GEMV's form)")
    b.comment("dequant q6_K wide: 4-byte ql / qh words -> 4·(q - 32) as int8 bytes -> f32; scale d·sc / 4 per run")
    blk = b.op("add.u32", b.op("shl.b32", group, Imm(1, "u32")), b.op("shr.u32", lane, Imm(4, "u32")))
    valid = b.op("setp.lt.u32", blk, count)
    block = b.op("mad.wide.u32", blk, Imm(BLOCK_BYTES, "u32"), w)
    h = b.op("and.b32", b.op("shr.u32", lane, Imm(3, "u32")), Imm(1, "b32"))
    l0 = b.op("shl.b32", b.op("and.b32", lane, Imm(7, "b32")), Imm(2, "u32"))
    ql = b.op("add.s64", block, b.op("cvt.u64.u32", b.op("mad.lo.u32", h, Imm(64, "u32"), l0)))
    qh = b.op("add.s64", block, b.op("cvt.u64.u32", b.op("mad.lo.u32", h, Imm(32, "u32"), l0)))
    sc_at = b.op("add.s64", block, b.op("cvt.u64.u32", b.op("mad.lo.u32", h, Imm(8, "u32"),
                                                              b.op("shr.u32", l0, Imm(4, "u32")))))

    def word(at, off):  # 4 bytes from two 2-byte loads (zero where the lane is past the row)
        lo, hi = b.op("mov.u32", Imm(0, "u32")), b.op("mov.u32", Imm(0, "u32"))
        b.emit("ld.global.nc.u16", lo, Mem(at, off), pred=valid)
        b.emit("ld.global.nc.u16", hi, Mem(at, off + 2), pred=valid)
        return b.op("prmt.b32", lo, hi, Imm(0x5410, "b32"))
    qa, qb, hw = word(ql, QL_OFFSET), word(ql, QL_OFFSET + 32), word(qh, QH_OFFSET)
    dbits = b.reg("b16")
    b.emit("mov.b16", dbits, Imm(0, "b16"))
    b.emit("ld.global.nc.b16", dbits, Mem(block, D_OFFSET), pred=valid)
    d4 = b.op("mul.rn.f32", b.op("cvt.f32.f16", dbits), Imm(0.25, "f32"))  # exact: a power of two
    runs = []
    for k in range(4):  # quarter k: low nibbles of qa (k = 0), qb (1), high of qa (2), qb (3); qh bits 2k, 2k + 1
        sc = b.op("mov.u32", Imm(0, "u32"), type="s32")
        b.emit("ld.global.nc.s8", sc, Mem(sc_at, SC_OFFSET + 2 * k), pred=valid)
        src = qa if k % 2 == 0 else qb
        lo = b.op("and.b32", src if k < 2 else b.op("shr.u32", src, Imm(4, "u32")), Imm(0x0F0F0F0F, "b32"))
        hi = b.op("and.b32", hw if k == 0 else b.op("shr.u32", hw, Imm(2 * k, "u32")), Imm(0x03030303, "b32"))
        q4 = b.op("shl.b32", b.op("xor.b32", b.op("or.b32", lo, b.op("shl.b32", hi, Imm(4, "u32"))),
                                  Imm(0x20202020, "b32")), Imm(2, "u32"))  # bytes: 4·(q − 32) as int8
        vals = [b.op("cvt.rn.f32.s32", b.op("bfe.s32", q4, Imm(8 * i, "u32"), Imm(8, "u32"), type="s32"))
                for i in range(4)]
        runs.append((vals, b.op("mul.rn.f32", d4, b.op("cvt.rn.f32.s32", sc))))

    def offsets():  # element 256·block + 128·h + 32·k + l0 .. + 3 of quarter k
        return b.op("add.u32", b.op("shl.b32", blk, Imm(8, "u32")), b.op("mad.lo.u32", h, Imm(128, "u32"), l0)), \
            (0, 32, 64, 96)
    return runs, offsets, valid


def run8(b, row, k0):
    """Weights k0 .. k0 + 7 of the row at `row` (k0 a multiple of 8): (d·sc)·(q − 32) in float32 as ggml (2-byte
    loads: the block is 2-byte aligned)."""
    kin = b.op("and.b32", k0, Imm(BLOCK_K - 1, "b32"))
    h = b.op("shr.u32", kin, Imm(7, "u32"))
    q4 = b.op("and.b32", b.op("shr.u32", kin, Imm(5, "u32")), Imm(3, "b32"))
    l = b.op("and.b32", kin, Imm(31, "b32"))
    block = b.op("mad.wide.u32", b.op("shr.u32", k0, Imm(8, "u32")), Imm(BLOCK_BYTES, "u32"), row)
    at = lambda off: b.op("add.s64", block, b.op("cvt.u64.u32", off))  # noqa: E731
    ql = at(b.op("add.u32", b.op("mad.lo.u32", h, Imm(64, "u32"), l),
                 b.op("shl.b32", b.op("and.b32", q4, Imm(1, "b32")), Imm(5, "u32"))))
    qh = at(b.op("mad.lo.u32", h, Imm(32, "u32"), l))
    sc_at = at(b.op("add.u32", b.op("mad.lo.u32", h, Imm(8, "u32"), b.op("shl.b32", q4, Imm(1, "u32"))),
                    b.op("shr.u32", l, Imm(4, "u32"))))
    dbits = b.reg("b16")
    b.emit("ld.global.nc.b16", dbits, Mem(block, D_OFFSET))
    ds = b.op("mul.rn.f32", b.op("cvt.f32.f16", dbits),
              b.op("cvt.rn.f32.s32", b.op("ld.global.nc.s8", Mem(sc_at, SC_OFFSET), type="s32")))
    lo_shift = b.op("shl.b32", b.op("shr.u32", q4, Imm(1, "u32")), Imm(2, "u32"))
    hi_shift = b.op("shl.b32", q4, Imm(1, "u32"))
    out = []
    for i in range(4):  # byte pairs 2i, 2i + 1
        a = b.op("ld.global.nc.u16", Mem(ql, QL_OFFSET + 2 * i), type="u32")
        hq = b.op("ld.global.nc.u16", Mem(qh, QH_OFFSET + 2 * i), type="u32")
        for j in range(2):
            lo = b.op("bfe.u32", a, b.op("add.u32", lo_shift, Imm(8 * j, "u32")), Imm(4, "u32"))
            hb = b.op("bfe.u32", hq, b.op("add.u32", hi_shift, Imm(8 * j, "u32")), Imm(2, "u32"))
            q = b.op("sub.s32", b.op("or.b32", lo, b.op("shl.b32", hb, Imm(4, "u32"))), Imm(32, "s32"), type="s32")
            out.append(b.op("mul.rn.f32", ds, b.op("cvt.rn.f32.s32", q)))
    return out


def run32(b, row, k0):
    """Weights k0 .. k0 + 31 (k0 a multiple of 32: one quarter of a half) — run8's values, bit for bit, with d and
    the quarter's two scales loaded once instead of four times (the MoE GEMM's A tile)."""
    kin = b.op("and.b32", k0, Imm(BLOCK_K - 1, "b32"))
    h = b.op("shr.u32", kin, Imm(7, "u32"))
    q4 = b.op("and.b32", b.op("shr.u32", kin, Imm(5, "u32")), Imm(3, "b32"))
    block = b.op("mad.wide.u32", b.op("shr.u32", k0, Imm(8, "u32")), Imm(BLOCK_BYTES, "u32"), row)
    at = lambda off: b.op("add.s64", block, b.op("cvt.u64.u32", off))  # noqa: E731
    ql = at(b.op("mad.lo.u32", h, Imm(64, "u32"), b.op("shl.b32", b.op("and.b32", q4, Imm(1, "b32")), Imm(5, "u32"))))
    qh = at(b.op("shl.b32", h, Imm(5, "u32")))
    sc_at = at(b.op("mad.lo.u32", h, Imm(8, "u32"), b.op("shl.b32", q4, Imm(1, "u32"))))
    dbits = b.reg("b16")
    b.emit("ld.global.nc.b16", dbits, Mem(block, D_OFFSET))
    d = b.op("cvt.f32.f16", dbits)
    ds = [b.op("mul.rn.f32", d, b.op("cvt.rn.f32.s32", b.op("ld.global.nc.s8", Mem(sc_at, SC_OFFSET + s), type="s32")))
          for s in range(2)]  # elements 0-15 and 16-31 of the quarter
    lo_shift = b.op("shl.b32", b.op("shr.u32", q4, Imm(1, "u32")), Imm(2, "u32"))
    hi_shift = b.op("shl.b32", q4, Imm(1, "u32"))
    out = []
    for i in range(16):  # byte pairs 2i, 2i + 1: both 6-bit q in one word (shifts by register once a pair)
        a = b.op("ld.global.nc.u16", Mem(ql, QL_OFFSET + 2 * i), type="u32")
        hq = b.op("ld.global.nc.u16", Mem(qh, QH_OFFSET + 2 * i), type="u32")
        pair = b.op("or.b32", b.op("and.b32", b.op("shr.u32", a, lo_shift), Imm(0x0F0F, "b32")),
                    b.op("shl.b32", b.op("and.b32", b.op("shr.u32", hq, hi_shift), Imm(0x0303, "b32")), Imm(4, "u32")))
        for j in range(2):
            q = b.op("sub.s32", b.op("bfe.u32", pair, Imm(8 * j, "u32"), Imm(8, "u32")), Imm(32, "s32"), type="s32")
            out.append(b.op("mul.rn.f32", ds[i // 8], b.op("cvt.rn.f32.s32", q)))
    return out
