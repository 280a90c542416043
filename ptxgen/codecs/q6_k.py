"""The Q6_K weight codec: GGUF's block_q6_K — ql[128] (low 4 bits), qh[64] (high 2 bits), 16 int8 scales (one per
16 weights), d (fp16): 210 bytes per 256 weights (blocks only 2-byte aligned), w = d·sc·(q − 32) with q 6 bits.
Each 128-weight half takes ql[64·h ...], qh[32·h ...], scales[8·h ...]; element 32·k + l of a half is
ql[l + 32·(k & 1)] (low nibble for k < 2, high for k ≥ 2) with bits 2k, 2k + 1 of qh[l] above them."""
from __future__ import annotations

from ..ir import Imm, Mem
from ._common import alignment_error, geometry, natural_words
from . import q4_k

FMT = "q6_K"
BLOCK_K, BLOCK_BYTES, QL_OFFSET, QH_OFFSET, SC_OFFSET, D_OFFSET = geometry(FMT, "ql", "qh", "scales", "d")
GROUP_BLOCKS = 1
LOAD_ALIGN = 2
EXACT_ROUTES = ("codec_few", "codec_mma", "mmq_ra", "mmq_pre", "mmq_f16", "codec_gemv")
ROUTES = {"exact": EXACT_ROUTES, "fast": ("fast_lanes",) + EXACT_ROUTES}  # mul_mat's routes (runtime/ops.py) per mode
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
    2-byte aligned) and the quarters' 4 scales. Four weights' q at a time: low nibbles | high bits << 4 per byte;
    each byte put under the exponent of 2^23 by one PRMT (the float 2^23 + q), less 2^23 + 32 by one FADD: q − 32
    exactly. (An I2F.S8 a weight did this before, 2026-12-02: a quarter-rate conversion, ~16 µs of the I2F pipe
    for 4096x14336 on the H200, as long as the whole issue budget.) Returns factored runs — per quarter (the 4
    values q − 32 as f32, the scale d·sc) — so the GEMV sums q·x first and scales once per quarter: the same
    products as ggml's fp32 weights times x up to fp32 rounding (~1e-7 relative), at 3 instructions a weight. Offsets
    as dequant_lane's, the first element 256·block + 128·h + l0."""
    if not f32:
        raise ValueError("q6_K dequant_lane_wide gives float32 runs only (the GEMV's form)")
    b.comment("dequant q6_K wide: 4-byte ql / qh words -> q bytes -> q - 32 as f32 (prmt under 2^23, sub); scale d·sc "
              "per run")
    blk = b.op("add.u32", b.op("shl.b32", group, Imm(1, "u32")), b.op("shr.u32", lane, Imm(4, "u32")))
    valid = None if count is None else b.op("setp.lt.u32", blk, count)  # None: both blocks inside the row
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
    d = b.op("cvt.f32.f16", dbits)
    runs = []
    for k in range(4):  # quarter k: low nibbles of qa (k = 0), qb (1), high of qa (2), qb (3); qh bits 2k, 2k + 1
        sc = b.op("mov.u32", Imm(0, "u32"), type="s32")
        b.emit("ld.global.nc.s8", sc, Mem(sc_at, SC_OFFSET + 2 * k), pred=valid)
        src = qa if k % 2 == 0 else qb
        lo = b.op("and.b32", src if k < 2 else b.op("shr.u32", src, Imm(4, "u32")), Imm(0x0F0F0F0F, "b32"))
        hi = b.op("and.b32", hw if k == 0 else b.op("shr.u32", hw, Imm(2 * k, "u32")), Imm(0x03030303, "b32"))
        q = b.op("or.b32", lo, b.op("shl.b32", hi, Imm(4, "u32")))  # bytes: q (0 .. 63)
        # q − 32 as f32: byte i under the exponent of 2^23 (one PRMT: 2^23 + q), less 2^23 + 32 (one FADD, exact)
        vals = [b.op("sub.rn.f32", b.op("prmt.b32", q, Imm(0x4B000000, "b32"), Imm(0x7650 + i, "b32"), type="f32"),
                     Imm(8388640.0, "f32")) for i in range(4)]
        runs.append((vals, b.op("mul.rn.f32", d, b.op("cvt.rn.f32.s32", sc))))

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


# The register-A wgmma MMQ (kernels/mmq.py, mmq_q6_k_wgmma_ra_n*): K-step s is quarter pair (h, sub) = ((s >> 1) & 1,
# s & 1) of block j = s >> 2 — weight i of the step is ql[64·h + i] (low nibble for sub 0, high for sub 1) with bits
# 4·sub + 2·(i ≥ 32) of qh[32·h + i % 32] above it, scale sc[8·h + 4·sub + i / 16]. TMA boxes must start 16-byte
# aligned in the row and the 210-byte blocks are only 2-byte aligned, so a step's box starts at 210·j + 64·h rounded
# down to 16 and is RA_BOX_BYTES wide (covers through d at block byte 208 from any start); the step's ql[64·h] sits
# o = (2·j) & 14 bytes into it.
RA_BOX_BYTES = 240  # ≥ 14 + 210, a multiple of 16; 60-word smem rows spread rows g = 0..7 over the banks
# The box from the block's own start (h = 0) holds the whole block: its 4 K-steps share it (one TMA a block, in a ring
# of its own: kernels/mmq.py _WgRing's A slots), step (h, sub) reading it 64·h bytes in. A box a step moved 240 bytes
# a row from L2 for 52.5 of weights: the GEMM waited on its copies (ncu, bench/NOTES.md 2026-12-02).
RA_BOX_STEPS = 4
RA_BOX_NOTE = "block j's box from 210·j rounded down to 16, shared by K-steps 4j .. 4j + 3: its bytes from (2·j) & 14"
HALF_1056 = 0x64206420  # (1056, 1056) fp16: 1024 + q − 1056 = q − 32
HALF_1152 = 0x64806480  # (1152, 1152) fp16: 1024 + (sc ^ 0x80) − 1152 = sc, an int8 scale exact in fp16
# the register-A decode's d·sc in fp16 arithmetic: the two scales of a step's row as halves (a byte pack, one lop3 and
# an HSUB2), times (d, d) by one HMUL2 — the exact product rounded once, as cvt.rn.f16.f32(d·sc) rounds float32's
# exact one: the same bits without the I2F / FMUL / F2F of each scale and the d widening (20 conversions an
# iteration of the n256 build's loop). False: the float32 form (A/B, and the bit-identity test)
RA_HALF_SCALES = True


def ra_step_offset(b, s):
    """Where K-step s = (h, sub) reads its block's box (ra_fragments' rbase), bytes: 64·h."""
    return b.op("shl.b32", b.op("and.b32", s, Imm(2, "b32")), Imm(5, "u32"))


def ra_box_column(b, s, offset=None):
    """K-step s's TMA box start in the row, bytes: 210·(s >> 2) + 64·((s >> 1) & 1) rounded down to 16; `offset` (a
    register, bytes) added before the rounding (a row group's row r: r·row bytes, kernels/mmq.py ROW_GROUP_NOTE)."""
    start = b.op("mad.lo.u32", b.op("shr.u32", s, Imm(2, "u32")), Imm(BLOCK_BYTES, "u32"),
                 b.op("shl.b32", b.op("and.b32", s, Imm(2, "b32")), Imm(5, "u32")))
    if offset is not None:
        start = b.op("add.u32", start, offset)
    return b.op("and.b32", start, Imm(~15 & 0xFFFFFFFF, "b32"))


def _broadcast_halves(b, v) -> list:
    """(lo, lo) and (hi, hi) of the f16x2 `v`, by moves of its halves: ptxas folds them into the HMUL2s that read
    them as operand selects (.H0_H0 / .H1_H1), where a prmt a broadcast stays an instruction (16 an iteration of
    mmq_q6_k_wgmma_ra_n256)."""
    halves = [b.reg("b16"), b.reg("b16")]
    b.emit("mov.b32", b.vec(halves), v)
    return [b.op("mov.b32", b.vec([h, h]), type="b32") for h in halves]


def ra_fragments(b, rbase, row_offs, s, t, natural: bool = False, phase=None):
    """One K-step's register-A fragments from its TMA box (rows of RA_BOX_BYTES at rbase + row_offs[rr]): lane (g, t)
    takes weights 8t .. 8t + 7 (ql bytes 8t.., qh bits 4·sub + 0, 1) and 32 + 8t .. + 7 (ql bytes 32 + 8t.., qh bits
    4·sub + 2, 3) of its rows g and g + 8 — the positions q4_k's register-A decode gives its low and high nibbles, so
    the activation keeps layouts.q4k_rega_k_order. The box's bytes are 2-byte aligned (o): each 8-byte run is three
    aligned words shifted by one prmt. A pair of weights becomes (1024 + q) halves by two lop3 (nibbles, then the qh
    bits under 0x6400), then (h − 1056)·(d·sc): q − 32 exact, d·sc rounded to fp16 from float32, then the product
    (two roundings, as Q5_K's; ggml's float32 d·sc·q rounds once). Returns the 4 k16 slices' A registers.
    `natural` (x in its own K order, kernels/mmq.py RA_NATURAL_FORMATS): the lane's weights are 2t, 2t + 1 of each
    8 of a quarter instead — ql and qh bytes as q4_k.RegA's natural words (two 2-byte loads and a prmt a word), the
    decode after them the same. `phase` (a register, even): the rows' own start in their 16 bytes, added to the
    block's (a row group's row r: (r·row bytes) & 15, kernels/mmq.py ROW_GROUP_NOTE)."""
    h = b.op("and.b32", b.op("shr.u32", s, Imm(1, "u32")), Imm(1, "b32"))
    sub = b.op("and.b32", s, Imm(1, "b32"))
    o = b.op("shr.u32", s, Imm(1, "u32"))
    if phase is not None:
        o = b.op("add.u32", o, phase)
    o = b.op("and.b32", o, Imm(14, "b32"))  # (2·j) & 14 (+ the phase): the step in the box
    if natural:  # byte 2t of the step's quarter-0 ql run (2-byte aligned: o is even), and of its qh bytes
        ql_at = b.op("add.u32", o, b.op("shl.b32", t, Imm(1, "u32")))
    else:
        sel = b.op("add.u32", b.op("mul.lo.u32", b.op("and.b32", o, Imm(2, "b32")), Imm(0x1111, "u32")),
                   Imm(0x3210, "u32"))  # bytes 0..3 (o % 4 = 0) or 2..5 (o % 4 = 2) of two words
        t8 = b.op("shl.b32", t, Imm(3, "u32"))
        ql_at = b.op("add.u32", b.op("and.b32", o, Imm(12, "b32")), t8)  # word-aligned starts of the runs
    qh_at = b.op("add.u32", ql_at, b.op("sub.u32", Imm(128, "u32"), b.op("shl.b32", h, Imm(5, "u32"))))
    sc_at = b.op("add.u32", b.op("add.u32", o, b.op("shl.b32", sub, Imm(2, "u32"))),
                 b.op("sub.u32", Imm(192, "u32"), b.op("mul.lo.u32", h, Imm(56, "u32"))))
    if not natural:  # (natural: the lane's weights of quarter c span both its 16-weight groups: sc[4·sub + 2c + wi])
        sc_at = b.op("add.u32", sc_at, b.op("shr.u32", t, Imm(1, "u32")))  # sc[4·sub + t / 2]; + 2 for the high run
    d_at = b.op("sub.u32", b.op("add.u32", o, Imm(208, "u32")), b.op("shl.b32", h, Imm(6, "u32")))
    nib = b.op("shl.b32", sub, Imm(2, "u32"))  # the nibble's shift: 0 or 4
    c1056 = b.op("mov.b32", Imm(HALF_1056, "b32"))
    c1152 = b.op("mov.b32", Imm(HALF_1152, "b32")) if RA_HALF_SCALES else None
    frag = {}

    def run(base, at):  # the 8 bytes at `at` (+ the 2-byte offset sel says) as two words
        if natural:  # bytes (2t, 2t + 8, 2t + 1, 2t + 9) of each 16 from `at` (byte 2t)
            return natural_words(b, b.op("add.u32", base, at))
        w = [b.op("ld.shared.u32", Mem(b.op("add.u32", base, at), 4 * i)) for i in range(3)]
        return [b.op("prmt.b32", w[i], w[i + 1], sel) for i in range(2)]

    for rr, roff in enumerate(row_offs):
        base = b.op("add.u32", rbase, roff)
        qls = [run(base, ql_at), run(base, b.op("add.u32", ql_at, Imm(32, "u32")))]  # low and high columns
        qhw = run(base, qh_at)
        dh = b.reg("b16")
        b.emit("ld.shared.b16", dh, Mem(b.op("add.u32", base, d_at)))
        if RA_HALF_SCALES and natural:  # (sc[2c], sc[2c + 1]) of each quarter c as halves, times (d, d)
            dd = b.op("mov.b32", b.vec([dh, dh]), type="b32")
            dss = []
            for c in range(2):
                pair = b.op("ld.shared.u16", Mem(b.op("add.u32", base, sc_at), 2 * c), type="u32")
                packed = b.op("prmt.b32", pair, pair, Imm(0x2120, "b32"))  # bytes (sc, 0, sc', 0)
                biased = b.op("lop3.b32", packed, Imm(0x00800080, "b32"), Imm(0x64006400, "b32"), Imm(0xBE, "b32"))
                dsv = b.op("mul.rn.f16x2", b.op("sub.rn.f16x2", biased, c1152, type="b32"), dd, type="b32")
                dss.append(_broadcast_halves(b, dsv))
        elif RA_HALF_SCALES:  # (sc0, sc1) as halves, times (d, d): both columns' d·sc in one HMUL2
            s0, s1 = (b.op("ld.shared.u8", Mem(b.op("add.u32", base, sc_at), 2 * c), type="u32") for c in range(2))
            packed = b.op("prmt.b32", s0, s1, Imm(0x1410, "b32"))  # bytes (s0, 0, s1, 0)
            biased = b.op("lop3.b32", packed, Imm(0x00800080, "b32"), Imm(0x64006400, "b32"), Imm(0xBE, "b32"))
            scs = b.op("sub.rn.f16x2", biased, c1152, type="b32")  # (x ^ 0x80) | 0x64: 1024 + 128 + sc
            dsv = b.op("mul.rn.f16x2", scs, b.op("mov.b32", b.vec([dh, dh]), type="b32"), type="b32")
            dss = _broadcast_halves(b, dsv)
        else:
            d = b.op("cvt.f32.f16", dh)
        qs = [b.op("shr.b32", w_, nib) for w_ in qhw]  # the step's qh bits from bit 0 of each byte

        def f32_scale(at):  # d·sc as (fp16, fp16), sc the int8 at `at`
            sc = b.op("ld.shared.s8", Mem(b.op("add.u32", base, sc_at), at), type="s32")
            dsh = b.op("cvt.rn.f16.f32", b.op("mul.rn.f32", d, b.op("cvt.rn.f32.s32", sc)), type="b16")
            return b.op("mov.b32", b.vec([dsh, dsh]), type="b32")
        for c in range(2):  # columns 8t.. (c = 0) and 32 + 8t.. (c = 1)
            if natural:  # (a scale per 16-weight group wi of the quarter)
                ds_w = dss[c] if RA_HALF_SCALES else [f32_scale(2 * c + wi) for wi in range(2)]
            elif RA_HALF_SCALES:
                ds = dss[c]
            else:
                ds = f32_scale(2 * c)
            for wi in range(2):
                if natural:
                    ds = ds_w[wi]
                lo = b.op("shr.b32", qls[c][wi], nib)  # the step's nibble at bits 0-3 of each byte
                # qh bits 4·sub + 2c, + 1 of each byte (qs = qh >> 4·sub, once a word): bytes 0, 2 to bits 4, 5 by
                # a constant left shift, bytes 1, 3 by a constant right one
                hi_even = b.op("shl.b32", qs[wi], Imm(4 - 2 * c, "u32"))
                hi_odd = b.op("shr.b32", qs[wi], Imm(4 + 2 * c, "u32"))
                for sh, hb in enumerate((hi_even, hi_odd)):
                    top = b.op("lop3.b32", hb, Imm(0x00300030, "b32"), Imm(0x64006400, "b32"), Imm(0xEA, "b32"))
                    v = b.op("shr.b32", lo, Imm(8, "u32")) if sh else lo
                    hv = b.op("lop3.b32", v, Imm(0x000F000F, "b32"), top, Imm(0xEA, "b32"))  # (v & m) | top
                    q = b.op("sub.rn.f16x2", hv, c1056, type="b32")
                    frag[rr, 4 * c + 2 * wi + sh] = b.op("mul.rn.f16x2", q, ds, type="b32")
    return [[frag[0, 2 * kk], frag[1, 2 * kk], frag[0, 2 * kk + 1], frag[1, 2 * kk + 1]] for kk in range(4)]


# --- the tensor-core decode GEMV (kernels/gemv_mma_codec.py) ---------------------------------------------------------
MMA_STEP_BYTES = BLOCK_BYTES  # a step's bytes per row (256 weights)
MMA_BOX_BYTES = 224  # a block's copy from its 16-byte aligned start: 210 bytes at an even offset ≤ 14
MMA_SLOT_BYTES = 240  # 60 words a row in shared memory: rows g = 0..7 in distinct banks


def mma_constants(b) -> dict:
    """The fp16 / fp32 constants mma_block's decode uses, in registers once per kernel."""
    c = {"zero": 0, "magic": 0x64006400, "n1056": 0xE420E420, "h16": 0x2C002C00, "n96": 0xD600D600,
         "c4b": 0x4B000000}
    return {k: b.op("mov.b32", Imm(v, "b32")) for k, v in c.items()}


class mma_block:  # noqa: N801 - a codec hook, named as the others
    """One row's super-block for the tensor-core GEMV, decoded on demand: `fragment(s)` — the A pairs (elements
    4t, 4t + 1) and (4t + 2, 4t + 3) of 16-element sub-block s as f16x2 of q − 32 (exact) — `scale(s)`, sc_s as
    f32, and `d`. `word(off)` / `word(off, lane=True)`: the block's 4 bytes at `off` (plus 4t with lane), `half(off)`
    its 2 bytes. Sub-block s = 8n + 2k + h is quarter k of half n, elements l = 16h + 4t + e: low (k < 2) or high
    nibbles of ql[64n + 32·(k & 1) + l] with bits 2k, 2k + 1 of qh[32n + l] — the 6 bits put beside 0x64 in each
    fp16 half (1024 + q, or 1024 + 16q for the high nibbles) by a prmt and two lop3, then h − 1056 or h/16 − 96."""

    def __init__(self, b, word, half, t, c):
        self.b, self.word, self.c, self._sc, self._runs = b, word, c, None, {}
        self.d = b.op("cvt.f32.f16", half(D_OFFSET))

    def _run(self, n, h):  # the (ql, ql + 32, qh) words of half n, l = 16h + 4t .. + 3, spread per byte pair
        key = (n, h)
        if key not in self._runs:
            b, c = self.b, self.c
            ws = [self.word(QL_OFFSET + 64 * n + 16 * h, True), self.word(QL_OFFSET + 64 * n + 32 + 16 * h, True),
                  self.word(QH_OFFSET + 32 * n + 16 * h, True)]
            per = []
            for sel in (0x4140, 0x4342):  # bytes (0, 1), (2, 3) into the low bytes of the two halves
                va, vb, u = (b.op("prmt.b32", w, c["zero"], Imm(sel, "b32")) for w in ws)
                per.append((va, vb, b.op("shl.b32", u, Imm(4, "u32")), b.op("shl.b32", u, Imm(2, "u32"))))
            self._runs[key] = per
        return self._runs[key]

    def fragment(self, s):
        b, c = self.b, self.c
        n, k, h = s // 8, (s % 8) // 2, s % 2
        out = []
        for va, vb, u4, u2 in self._run(n, h):
            v, u = (va if k % 2 == 0 else vb), (u4 if k % 2 == 0 else u2)  # qh bits 2k, 2k + 1 at 4-5 (k < 2), 8-9
            hi_mask, lo_mask = (0x00300030, 0x000F000F) if k < 2 else (0x03000300, 0x00F000F0)
            top, r = b.reg("b32"), b.reg("b32")
            b.emit("lop3.b32", top, u, Imm(hi_mask, "b32"), c["magic"], Imm(0xEA, "b32"))  # (u & mask) | 0x6400
            b.emit("lop3.b32", r, v, Imm(lo_mask, "b32"), top, Imm(0xEA, "b32"))
            out.append(b.op("add.rn.f16x2", r, c["n1056"], type="b32") if k < 2 else
                       b.op("fma.rn.f16x2", r, c["h16"], c["n96"], type="b32"))
        return out

    def scale(self, s):
        b = self.b
        if self._sc is None:  # the 16 int8 scales
            self._sc = [self.word(SC_OFFSET + 4 * i) for i in range(4)]
        return b.op("cvt.rn.f32.s32", b.op("bfe.s32", self._sc[s // 4], Imm(8 * (s % 4), "u32"), Imm(8, "u32")),
                    type="f32")


class I8Block:
    """One row's super-block for the int8 few-token GEMVs (gemv_t1._I8Q6Step), decoded on demand: `a(s)` — lane t's
    elements 4t .. 4t + 3 of 16-element sub-block s as u8 q (0 .. 63, without the −32: the GEMV takes it as
    Σ_s sc_s·X_s), the A register of m16n8k16 u8 x s8 for this row —, `scale(s)`, sc_s sign-extended (one prmt),
    `scale_pairs(...)`, the A registers of the −32 MMA (sc_2t, sc_2t + 1) and (sc_2t + 8, sc_2t + 9) as f16x2, and
    `d` (f32). `word(off)` / `word(off, lane=True)` / `half(off)` as mma_block's. Sub-block s = 8n + 2k + h: the low
    (k < 2) or high nibbles of ql[64n + 32·(k & 1) + l] beside bits 2k, 2k + 1 of qh[32n + l] (l = 16h + 4t ..):
    qh & 0x33333333 holds quarters 0 and 2 of each byte at bits 0-1 and 4-5, (qh >> 2) & 0x33333333 quarters 1 and
    3, so each A is one bit select (lop3) of a nibble word and a qh word, after at most a shift of each."""

    def __init__(self, b, word, half, t, sels):
        self.b, self.word, self.sels = b, word, sels
        self.d = b.op("cvt.f32.f16", half(D_OFFSET))
        self._runs, self._sc = {}, None

    @staticmethod
    def constants(b):
        """The prmt selectors of scale(s) in registers, once a kernel: byte j, then its sign in the others (an
        immediate selector with the sign bits set is refused by ir.Instr as a likely __byte_perm mistake)."""
        from ..layouts import prmt_selector
        return [b.op("mov.b32", Imm(prmt_selector(j, j, j, j, sign=(1, 2, 3)), "b32")) for j in range(4)]

    def _run(self, n, h):
        if (n, h) not in self._runs:
            b, word = self.b, self.word
            ql0, ql1 = word(QL_OFFSET + 64 * n + 16 * h, True), word(QL_OFFSET + 64 * n + 32 + 16 * h, True)
            qh = word(QH_OFFSET + 32 * n + 16 * h, True)
            m = Imm(0x33333333, "b32")
            qa, qb = b.op("and.b32", qh, m), b.op("and.b32", b.op("shr.u32", qh, Imm(2, "u32")), m)

            def pick(lo, hi):  # (lo & 0x0F0F0F0F) | (hi & 0xF0F0F0F0)
                r = b.reg("b32")
                b.emit("lop3.b32", r, lo, Imm(0x0F0F0F0F, "b32"), hi, Imm(0xE2, "b32"))
                return r
            self._runs[n, h] = (pick(ql0, b.op("shl.b32", qa, Imm(4, "u32"))),
                                pick(ql1, b.op("shl.b32", qb, Imm(4, "u32"))),
                                pick(b.op("shr.u32", ql0, Imm(4, "u32")), qa),
                                pick(b.op("shr.u32", ql1, Imm(4, "u32")), qb))
        return self._runs[n, h]

    def a(self, s):
        return self._run(s // 8, s % 2)[(s % 8) // 2]

    def _words(self):
        if self._sc is None:  # the 16 int8 scales
            self._sc = [self.word(SC_OFFSET + 4 * i) for i in range(4)]
        return self._sc

    def scale(self, s):
        w = self._words()[s // 4]
        return self.b.op("prmt.b32", w, w, self.sels[s % 4])

    def scale_pairs(self, t_hi, sel, magic, bias):
        """(sc_2t, sc_2t + 1), (sc_2t + 8, sc_2t + 9) as f16x2 (the −32 MMA's A of this row): word t / 2 (and 2 +
        t / 2) by `t_hi` (t ≥ 2), its bytes 2·(t % 2), + 1 beside 0x64 by the prmt selector `sel` after flipping
        their signs (1024 + sc + 128 as fp16), minus `bias` (1152, 1152)."""
        b, w = self.b, self._words()
        out = []
        for lo, hi in ((w[0], w[1]), (w[2], w[3])):
            v = b.op("xor.b32", b.op("selp.b32", hi, lo, t_hi), Imm(0x80808080, "b32"))
            out.append(b.op("sub.rn.f16x2", b.op("prmt.b32", v, magic, sel), bias, type="b32"))
        return out


class GgmlLane(q4_k.GgmlLane):
    """Q6_K in kernels/gemv.py's MMVQ-style lane GEMV (build_lanes_ggml: gemv_q6_k_fast_t*, int8 x Q8_1 with dp4a,
    as llama.cpp's vec_dot_q6_K_q8_1): unit u of a row is 64 weights of super-block u / 4 — half n = (u / 2) % 2,
    elements 16s .. 16s + 15 (s = u % 2) of each of its four quarters: ql[64n + 16s ..] and ql[64n + 32 + 16s ..]
    (low nibbles: quarters 0, 1; high: 2, 3), qh[32n + 16s ..] (bits 2k, 2k + 1 for quarter k), the quarters'
    scales (bytes s, s + 2, s + 4, s + 6 of scales[8n ..]) and d: every bit loaded is used. The blocks are 2-byte
    aligned: with K a multiple of 512 (an even number of 210-byte blocks a row: rows 4-byte aligned) and the
    weights 4-byte aligned, block b starts 2·(b % 2) bytes past a word; each 16-byte run is loaded as 5 words from
    the word at or below it and one prmt a word realigns them. Quarter k's activation is Q8_1 block 4n + k, words
    4s .. 4s + 3: y += d·sc·d_a·Σ(q − 32)·q_a per 16 weights, q − 32 as int8 by ((q + 0x60) ^ 0x80) bytewise."""
    WORDS = 19  # 5 + 5 (ql) + 5 (qh) + 3 (the 8 scale bytes) + 1 (d)
    K_MULTIPLE = 512
    ALIGN = 4  # (the weights' pointer: mul_mat runs the exact routes for others)
    MIN_CTAS = q4_k.WIDE_LANE_MIN_CTAS
    EXACT = False  # int8 x Q8_1 only (its exact decode is the codec GEMVs' and the few-token builds')
    BLOCK_BYTES = BLOCK_BYTES  # (Q4_K's lane's units and sizes; its loads, activations and dots are this one's)

    def __init__(self, b, lane):
        pass

    @staticmethod
    def _odd(b, u):
        """Whether unit u's block starts 2 bytes past a word (an odd block of the row)."""
        return b.op("setp.ne.u32", b.op("and.b32", u, Imm(4, "b32")), Imm(0, "u32"))

    def load(self, b, u, rowptr, regs, pred):
        """Unit u of a row: its ql, qh, scale runs and d as words from the word at or below each."""
        n16 = b.op("and.b32", b.op("shl.b32", u, Imm(3, "u32")), Imm(16, "b32"))  # 16·n
        s16 = b.op("shl.b32", b.op("and.b32", u, Imm(1, "b32")), Imm(4, "u32"))  # 16·s
        blk = b.op("sub.u32", b.op("mul.lo.u32", b.op("shr.u32", u, Imm(2, "u32")), Imm(BLOCK_BYTES, "u32")),
                   b.op("selp.u32", Imm(2, "u32"), Imm(0, "u32"), self._odd(b, u)))  # the word at or below
        base = b.op("add.s64", rowptr, b.op("cvt.u64.u32", blk))
        ql = b.op("add.s64", base, b.op("cvt.u64.u32", b.op("add.u32", b.op("shl.b32", n16, Imm(2, "u32")), s16)))
        qh = b.op("add.s64", base, b.op("cvt.u64.u32", b.op("add.u32", b.op("shl.b32", n16, Imm(1, "u32")), s16)))
        sc = b.op("add.s64", base, b.op("cvt.u64.u32", b.op("shr.u32", n16, Imm(1, "u32"))))
        runs = [(ql, QL_OFFSET, 5), (ql, QL_OFFSET + 32, 5), (qh, QH_OFFSET, 5), (sc, SC_OFFSET, 3), (base, D_OFFSET, 1)]
        i = 0
        for p, off, words in runs:
            for w in range(words):
                b.emit("ld.global.nc.u32", regs[i], Mem(p, off + 4 * w), pred=pred)
                i += 1

    def act(self, b, u, actptr, gsize, pred, tail):
        """A token's Q8_1 activation of unit u: words 4s .. 4s + 3 of blocks 4n .. 4n + 3 of its super-block (64
        contiguous bytes of the lane layout) and their d."""
        base = b.op("add.s64", actptr, b.op("mul.wide.u32", b.op("shr.u32", u, Imm(4, "u32")), Imm(gsize, "u32")))
        col = b.op("and.b32", b.op("shr.u32", u, Imm(1, "u32")), Imm(7, "b32"))  # blocks 4·col .. 4·col + 3
        cb = b.op("add.s64", base, b.op("cvt.u64.u32", b.op("add.u32", b.op("shl.b32", col, Imm(6, "u32")),
                                                           b.op("shl.b32", b.op("and.b32", u, Imm(1, "b32")), Imm(9, "u32")))))
        wv = [b.regs("b32", 4) for _ in range(4)]
        dv = b.regs("f32", 4)
        if tail:
            for reg in [r for q in wv for r in q] + dv:
                b.emit("mov.b32", reg, Imm(0, "b32"))
        for k in range(4):
            b.emit("ld.global.nc.v4.u32", b.vec(wv[k]), Mem(cb, 16 * k), pred=pred)
        b.emit("ld.global.nc.v4.f32", b.vec(dv), Mem(b.op("add.s64", base, b.op("cvt.u64.u32", b.op("shl.b32", col, Imm(4, "u32")))),
                                                     1024), pred=pred)
        return wv, dv

    def compute(self, b, u, ws, acts, acc, ones):
        """dp4a over the step's unit of each row `ws[r]` and token (acts[t] = act()), into acc[r][t]."""
        odd = self._odd(b, u)
        sel = b.op("selp.b32", Imm(0x5432, "b32"), Imm(0x3210, "b32"), odd)
        dsel = b.op("selp.b32", Imm(0x32, "b32"), Imm(0x10, "b32"), odd)
        spos = b.op("shl.b32", b.op("and.b32", u, Imm(1, "b32")), Imm(3, "u32"))  # 8·s: scale byte s of a word
        for r, w in enumerate(ws):
            run = [[b.op("prmt.b32", w[5 * k + i], w[5 * k + i + 1], sel) for i in range(4)] for k in range(3)]
            qla, qlb, qh = run
            scw = [b.op("prmt.b32", w[15 + i], w[16 + i], sel) for i in range(2)]
            d = b.op("cvt.f32.f16", b.op("cvt.u16.u32", b.op("prmt.b32", w[18], Imm(0, "b32"), dsel)))
            for k in range(4):
                src = qla if k % 2 == 0 else qlb
                hsh = 4 - 2 * k  # qh bits 2k, 2k + 1 to bits 4, 5
                q = [b.op("or.b32",
                          b.op("and.b32", src[i] if k < 2 else b.op("shr.u32", src[i], Imm(4, "u32")), Imm(0x0F0F0F0F, "b32")),
                          b.op("and.b32", b.op("shl.b32", qh[i], Imm(hsh, "u32")) if hsh > 0 else
                               b.op("shr.u32", qh[i], Imm(-hsh, "u32")) if hsh < 0 else qh[i], Imm(0x30303030, "b32")))
                     for i in range(4)]
                q = [b.op("xor.b32", b.op("add.u32", v, Imm(0x60606060, "u32")), Imm(0x80808080, "b32")) for v in q]
                sc = b.op("bfe.s32", scw[k // 2], b.op("add.u32", spos, Imm(16 * (k % 2), "u32")), Imm(8, "u32"))
                for t in range(len(acts)):
                    s_ = Imm(0, "s32")
                    for i in range(4):
                        s_ = b.op("dp4a.s32.s32", q[i], acts[t][0][k][i], s_, type="s32")
                    f = b.op("cvt.rn.f32.s32", b.op("mul.lo.s32", s_, sc))
                    b.emit("fma.rn.f32", acc[r][t], b.op("mul.rn.f32", d, acts[t][1][k]), f, acc[r][t])
