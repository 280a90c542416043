"""The Q4_K weight codec: GGUF's block_q4_K geometry and every decode of it the kernels use.

A super-block is BLOCK_BYTES = 144 bytes for BLOCK_K = 256 weights: d and dmin (fp16), 12 bytes of packed 6-bit
(scale, min) pairs for its 8 sub-blocks of SUB_K = 32, then 128 bytes of qs (4-bit quants: byte i of 32-byte chunk c
holds sub-block 2c in its low nibble and 2c + 1 in its high one). w = d·sc·q − dmin·m (ggml's dequantize_row_q4_K).

The decodes, by the kernels that consume them:
- `scale_ops` / `dequant_word` / `lane_scales`: fp32, exactly ggml's (dequantize_q4_k, the fixup's exact
  recompute, the fp32 decode GEMVs);
- `f16_words` (and `scale_pairs`, `dequant_pair`, `scale_ints`, `dequant_pair3`): fp16 operands in the canonical K
  order for the tensor-core GEMMs;
- `RegDecoder`: the few-token tensor-core kernels' register decode (A = q·sc as fp16, the min term by its own MMA);
- `RegA`: the register-A wgmma MMQs' decode straight into A fragments (Q5_K's too, with its fifth bits);
- `MmaGemvDecoder` (with `mma_header`, `mma_scale_pair`): the tensor-core decode GEMV's (gemv_q4_k_mma) A fragments,
  the min MMA's A and the super-block's fp32 value, on a ring of MMA_ROW_BYTES rows;
- `UnitLane`, `GgmlLane`: the 8-weight-unit GEMV's and the MMVQ-style lane GEMV's lane (loads, elements, scales);
- `Q8Decoder`, `Q8Scales` (with `q8_lane_offset`, `scale_min_f32`): the int8 x Q8_1 MMQ's (mmq_q4_k_q8_n*) A
  fragments straight from the raw ring, the min term's accumulation and its per-step (d·sc, −dmin·m) table.
What the shared builders ask of it beyond its decodes is data: DECODE (the runtime's decode route), RAW_RING,
Q8_MMQ, WGMMA_ALL, NIBBLE_COLUMNS (kernels/mmq.py); the raw ring's geometry is here too (`row_bytes`, `raw_copies`,
`raw_offsets`: which bytes of a row a cp.async ring stage holds, and where).
"""
from __future__ import annotations

from ..dsl import (ApplyScaleMin, ConvertHalf, DecodeScaleMin6, DecodeScaleMinPair6, DequantSequence, LoadWords, ScaleProduct,
                   SplitHalves, UnpackNibbles)
from ..ir import Imm, Mem
from ..formats.tq4_1s import LANE_SUMS
from ._common import alignment_error, geometry, kquant_lane_wide, natural_words

FMT = "q4_K"
BLOCK_K, BLOCK_BYTES, HEADER_BYTES = geometry(FMT, "qs")  # 256, 144, 16 (d, dmin, scales[12], then qs)
SUB_K = 32
STEP_K = 64  # the GEMMs' K step: one pair of sub-blocks,
STEP_ROW_BYTES = HEADER_BYTES + 32  # the header and the pair's 32 qs bytes per row and step
GROUP_BLOCKS = 1  # blocks a warp dequantizes at once (dequant_lane): one super-block
LOAD_ALIGN = 4  # dequant_lane's widest load
# mul_mat's routes (runtime/ops.py), in the order they are tried, per mode
EXACT_ROUTES = ("t16h", "mma_n16", "skinny", "mmq", "small_gemv", "decode")
# fast: the int8 MMQ (to RULES.q8_max_tokens) and the int8 lane GEMV (to RULES.fast_lanes_max_tokens), else the exact routes
ROUTES = {"exact": EXACT_ROUTES, "fast": ("mmq_q8", "fast_lanes") + EXACT_ROUTES}
# the exact decode route's choices per slice (runtime/ops.py _decode): the knob that turns the tensor-core GEMV on or
# off; from how many tokens it runs on auto (1 from q4k_mma_t1_min_weights weights, else q4k_mma_gemv_min_tokens:
# ptxgen/tuning rules); the few-token builds' knob and their rule on auto; the opt-in one-token kernel with x in
# registers (PTXGEN_Q4K_XR); the lane GEMVs are not TMA-fed (no "lane_tma")
DECODE = {"mma_knob": "q4k_mma", "mma_min": ("q4k_mma_t1_min_weights", 1, "q4k_mma_gemv_min_tokens"),
          "few_knob": "q4k_t1", "few_min_weights": "q4k_t1_min_weights", "xr": "gemv_q4_k_xr"}
weights_error = alignment_error(FMT, 16)  # the GEMVs' and GEMMs' 16-byte loads, the TMA maps
# what the MMQs of kernels/mmq.py do with it: the fp16 mma.sync ones (and the grouped MoE one) stream its raw 16-byte
# columns through a cp.async / TMA ring and dequantize there (the other codecs decode from global memory by run8);
# the int8 x Q8_1 MMQ decodes it; every wgmma lowering does (A from shared memory, prepared, clusters; the other
# codecs have the register-A ones); the register-A builds take NIBBLE_COLUMNS 16-byte columns a K-step (the header,
# the pair's qs bytes 0-15 and 16-31)
RAW_RING = True
Q8_MMQ = True
WGMMA_ALL = True
NIBBLE_COLUMNS = 3
BLOCK_BOX = ("grouped",)  # mmq's schedules with a block's rows in one TMA box (NIBBLE_BLOCK_BOX): dense n256 spills
ROW_BOX_PITCH = 160  # the block box's row pitch: 144 + 16, so rows g = 0..3's 8-byte qs loads fall in distinct banks


def row_bytes(b, K):
    """A weight row of K columns in bytes: K / BLOCK_K super-blocks of BLOCK_BYTES, by a shift (the MMQs' form;
    _common.row_bytes divides)."""
    assert BLOCK_K == 256
    return b.op("mul.lo.u32", b.op("shr.u32", K, Imm(8, "u32")), Imm(BLOCK_BYTES, "u32"))


def raw_copies(b, tid, m0, mlast, stride, w, rows: int, threads: int) -> list:
    """A thread's share of the raw ring's cp.async copies (kernels/mmq.py _issue_raw): a stage holds `rows` weight
    rows from m0 in rows of STEP_ROW_BYTES, NIBBLE_COLUMNS 16-byte chunks each (the header, the pair's qs bytes 0-15
    and 16-31); thread tid takes chunks tid, tid + threads, ... Rows past M read row mlast (the epilogue drops them).
    Returns per chunk (valid, column, the weight row's address, its offset in the stage); raw_offsets gives the
    column's bytes in the row per step. `stride`: row_bytes(K), `w`: the weights."""
    copies = []
    for r in range(-(-rows * NIBBLE_COLUMNS // threads)):
        i = b.op("add.u32", tid, Imm(threads * r, "u32"))
        ok = b.op("setp.lt.u32", i, Imm(rows * NIBBLE_COLUMNS, "u32"))
        row = b.op("div.u32", i, Imm(NIBBLE_COLUMNS, "u32"))
        column = b.op("rem.u32", i, Imm(NIBBLE_COLUMNS, "u32"))
        grow = b.op("min.u32", b.op("add.u32", m0, row), mlast)
        src_row = b.op("mad.wide.u32", grow, stride, w)
        dst_off = b.op("mad.lo.u32", row, Imm(STEP_ROW_BYTES, "u32"), b.op("shl.b32", column, Imm(4, "u32")))
        copies.append((ok, column, src_row, dst_off))
    return copies


def raw_offsets(b, step):
    """Where K-step `step`'s chunks lie in a weight row: super-block sb = step / 4 and its pair c = step % 4, emitted
    here once a step. Returns offset(column): the byte offset of raw_copies' `column` (a register) in the row,
    BLOCK_BYTES·sb + (column == 0 ? 0 : HEADER_BYTES + 32c + 16·(column − 1))."""
    assert HEADER_BYTES == 16  # so the qs chunks sit at 32c + 16·column
    sb = b.op("shr.u32", step, Imm(2, "u32"))
    c = b.op("and.b32", step, Imm(3, "b32"))

    def offset(column):
        qoff = b.op("mad.lo.u32", c, Imm(32, "u32"), b.op("shl.b32", column, Imm(4, "u32")))
        off = b.op("selp.b32", Imm(0, "b32"), qoff, b.op("setp.eq.u32", column, Imm(0, "u32")))
        return b.op("mad.lo.u32", sb, Imm(BLOCK_BYTES, "u32"), off)
    return offset


def scale_ops() -> tuple:
    """d·sc and dmin·m (f32) of sub-blocks env["sub_lo"] (even: a chunk's low nibbles) and env["sub_lo"] + 1 (its
    high nibbles) from the header words env["hdr"] (d|dmin, then the 12 scale bytes): leaves env["d_lo"],
    env["min_lo"], env["d_hi"], env["min_hi"]."""
    return (
        SplitHalves("hdr", 0, ("d", "dmin")),
        DecodeScaleMinPair6("hdr", 1, "sub_lo", ("sc_lo", "m_lo", "sc_hi", "m_hi")),
        ScaleProduct("d", "sc_lo", "d_lo"), ScaleProduct("dmin", "m_lo", "min_lo"),
        ScaleProduct("d", "sc_hi", "d_hi"), ScaleProduct("dmin", "m_hi", "min_hi"),
    )


def dequant_word() -> DequantSequence:
    """Q4_K for one 32-bit word of `qs` inside super-block env["block"]: 8 weights, 4 from sub-block
    env["sub_lo"] (low nibbles) and 4 from env["sub_hi"] (high nibbles). Leaves f32 env["w_lo"], env["w_hi"]."""
    return DequantSequence("q4_K", (
        LoadWords("hdr", 0, 4),  # d|dmin, scales[0:12]
        *scale_ops(),
        UnpackNibbles("qword", ("q_lo", "q_hi")),
        ApplyScaleMin("q_lo", "d_lo", "min_lo", "w_lo"),
        ApplyScaleMin("q_hi", "d_hi", "min_hi", "w_hi"),
    ))


def lane_scales(b, hdr, sub_lo, sub_hi):
    """(d·sc, dmin·m) of the lane's two sub-blocks from the loaded 16-byte header."""
    env = {"hdr": hdr, "sub_lo": sub_lo, "sub_hi": sub_hi}
    for op in scale_ops():
        op.lower(b, env)
    return env["d_lo"], env["min_lo"], env["d_hi"], env["min_hi"]


def f16_words(b, hdr, qs, sub, dscale, nibmask, magic, three: bool = True) -> list:
    """The fp16 dequant both MMQ lowerings share (shared-memory A): super-block header `hdr` (4 words), 32 bytes of
    qs (8 words), sub-block `sub` → 16 f16x2 words, the 32 weights of one half (low or high nibbles, chosen
    by `nibmask`) in k order: word 2i + p holds k = 4i + 2p, 4i + 2p + 1.

    Nibbles become fp16 by `prmt` + `lop3` with the 0x6400 exponent (1024 + q); high nibbles come out as 16q,
    so `dscale` (1 or 1/16, exact) is folded into sc' = sc·dscale. Then `dequant_pair3`: q·sc' by one exact
    fma, ·d − m_hi − m_lo (dmin·m formed in fp32, as ggml does, split into fp16 hi + lo) — three instructions
    per two weights and ~3.4e-4 relative GEMM error (bench/NOTES.md; the hi/lo d·sc pairs before it took four and
    gave 3.9e-4, a single fp16 d·sc and dmin·m 7.2e-4). `three=False`: those four-instruction pairs
    (dequant_pair), one register fewer (mmq.F16_FOUR_OP_TILES)."""
    if not three:
        scale = scale_pairs(b, hdr, sub, dscale)
        return [dequant_pair(b, h, scale, magic) for h in _nibble_halves(b, qs, nibmask, magic)]
    sc, m_hi, m_lo, d = scale_ints(b, hdr, sub, dscale)
    scale = (sc, b.op("mul.rn.f16x2", sc, b.op("mov.b32", Imm(NEG_1024_F16X2, "b32")), type="b32"), d, m_hi, m_lo)
    return [dequant_pair3(b, h, scale) for h in _nibble_halves(b, qs, nibmask, magic)]


def _nibble_halves(b, qs, nibmask, magic):
    """The 16 f16x2 words (0x6400 | q) of one nibble half of 8 qs words, in k order."""
    for wv in qs:  # bytes (b0, b1) and (b2, b3) of each word → two f16x2
        for sel in (0x4140, 0x4342):
            v = b.op("prmt.b32", wv, Imm(0, "b32"), Imm(sel, "b32"))
            h = b.reg("b32")
            b.emit("lop3.b32", h, v, nibmask, magic, Imm(0xEA, "b32"))  # (v & mask) | 0x6400
            yield h


def scale_pairs(b, hdr, sub, dscale):
    """Sub-block `sub` of a Q4_K super-block header `hdr` (4 words) → (d_hi, d_lo, −m_hi, −m_lo) as f16x2 (both
    halves equal): d·sc·dscale and dmin·m formed in fp32, as ggml does, each split into fp16 hi + lo."""
    env = {"hdr": hdr, "sub": sub}
    SplitHalves("hdr", 0, ("d", "dmin")).lower(b, env)
    DecodeScaleMin6("hdr", 1, "sub", ("sc", "m")).lower(b, env)
    d1 = b.op("mul.rn.f32", b.op("mul.rn.f32", env["d"], b.op("cvt.rn.f32.u32", env["sc"])), dscale)
    m1 = b.op("mul.rn.f32", env["dmin"], b.op("cvt.rn.f32.u32", env["m"]))

    def split(v):
        hi = b.op("cvt.rn.f16.f32", v)
        lo = b.op("cvt.rn.f16.f32", b.op("sub.rn.f32", v, b.op("cvt.f32.f16", hi)))
        return b.op("mov.b32", b.vec([hi, hi]), type="b32"), b.op("mov.b32", b.vec([lo, lo]), type="b32")
    d_hi, d_lo = split(d1)
    nm_hi, nm_lo = split(b.op("neg.f32", m1))
    return d_hi, d_lo, nm_hi, nm_lo


def dequant_pair(b, h, scale, magic):
    """Two weights from h = (0x6400 | q) halves (1024 + q, or 1024 + 16q for high nibbles, whose 1/16 is in
    the scale): q·d_hi + q·d_lo − m_hi − m_lo with fp16 rounding per step (`scale_pairs`)."""
    d_hi, d_lo, nm_hi, nm_lo = scale
    q = b.op("sub.rn.f16x2", h, magic, type="b32")
    t = b.op("fma.rn.f16x2", q, d_hi, nm_hi, type="b32")
    t = b.op("fma.rn.f16x2", q, d_lo, t, type="b32")
    return b.op("add.rn.f16x2", t, nm_lo, type="b32")


NEG_1024_F16X2 = 0xE400E400  # −1024 in both halves
# RegA decodes a lane's scales once a super-block (4 K-steps) into registers and picks each step's from them, not
# from the header every step (the same values: bits unchanged). False: the per-step decode (for A/B probes).
RA_BLOCK_SCALES = True
# ... and where the caller names the step of the block (fragments' `step`: the grouped builds, whose items are whole
# blocks), at step 0 without the run-time test and its branch, each step's pick by a constant selector: same bits,
# mmq_q4_k_wgmma_ra_n64_moe 1496 -> 1328 SASS, 128 x top-8 T = 512 87.9 -> 86.1 µs graph on the H200
# (probe_moe_static_steps_0f26630.log). False: the run-time test at every step (for A/B probes).
RA_STATIC_STEPS = True


def scale_ints(b, hdr, sub, dscale):
    """Sub-block `sub` of a Q4_K super-block header `hdr` → (sc', −m_hi, −m_lo, d) as f16x2 broadcasts for
    `dequant_pair3`: sc' = sc·dscale (exact in fp16: sc ≤ 63, dscale 1 or 1/16), d the header's own fp16 d,
    dmin·m formed in fp32 as ggml does (exact there) and split into fp16 hi + lo."""
    env = {"hdr": hdr, "sub": sub}
    DecodeScaleMin6("hdr", 1, "sub", ("sc", "m")).lower(b, env)
    d, dmin = b.reg("b16"), b.reg("b16")
    b.emit("mov.b32", b.vec([d, dmin]), hdr[0])
    sc = b.op("cvt.rn.f16.f32", b.op("mul.rn.f32", b.op("cvt.rn.f32.u32", env["sc"]), dscale))
    m1 = b.op("neg.f32", b.op("mul.rn.f32", b.op("cvt.f32.f16", dmin), b.op("cvt.rn.f32.u32", env["m"])))
    m_hi = b.op("cvt.rn.f16.f32", m1)
    m_lo = b.op("cvt.rn.f16.f32", b.op("sub.rn.f32", m1, b.op("cvt.f32.f16", m_hi)))
    return tuple(b.op("mov.b32", b.vec([v, v]), type="b32") for v in (sc, m_hi, m_lo, d))


def dequant_pair3(b, h, scale):
    """Two weights from h = (0x6400 | q) halves (1024 + q, or 1024 + 16q for high nibbles, whose 1/16 is in sc')
    and scale = (sc', −1024·sc', d, −m_hi, −m_lo) f16x2: q·sc' = fma(h, sc', −1024·sc') is exact (every term is
    an fp16 integer multiple of sc' below 2^11), then q·sc'·d − m_hi in one rounding, + (−m_lo). Three
    instructions per two weights (dequant_pair takes four) and closer to the fp16 floor: a bench/NOTES.md
    model puts it at 3.0-3.5e-4 relative GEMM error where q4k_dequant_pair gives 3.7-4.0e-4."""
    sc, c, d, nm_hi, nm_lo = scale
    qs = b.op("fma.rn.f16x2", h, sc, c, type="b32")
    return b.op("add.rn.f16x2", b.op("fma.rn.f16x2", qs, d, nm_hi, type="b32"), nm_lo, type="b32")


def dequant_pair2(b, h, scale):
    """dequant_pair3 without its last add: q·sc'·d − m_hi in one rounding, the −m_lo of the sub-block left to a
    min-term MMA on the activation's sub-block sums (kernels/mmq.py RA_MIN_LO_MMA). Two instructions per two
    weights, and closer to float64 than dequant_pair3 (bench/model_decode_roundings.py: dmin·m kept exact)."""
    sc, c, d, nm_hi = scale[:4]
    return b.op("fma.rn.f16x2", b.op("fma.rn.f16x2", h, sc, c, type="b32"), d, nm_hi, type="b32")


# The packed 6-bit (scale, min) pairs of a super-block's header words s0, s1, s2 (bytes 4-15) as 4 bytes a word
# (ggml's get_scale_min_k4): sub-blocks 0-3 are the low 6 bits of s0 / s1, 4-7 the nibbles of s2 with the top bits
# of s0 / s1's bytes. Each emits its own instructions, so callers keep their order.
def scales_0_3(b, s0):
    return b.op("and.b32", s0, Imm(0x3F3F3F3F, "b32"))


def scales_4_7(b, s0, s2):
    return b.op("or.b32", b.op("and.b32", s2, Imm(0x0F0F0F0F, "b32")),
                b.op("and.b32", b.op("shr.u32", s0, Imm(2, "u32")), Imm(0x30303030, "b32")))


def mins_0_3(b, s1):
    return b.op("and.b32", s1, Imm(0x3F3F3F3F, "b32"))


def mins_4_7(b, s1, s2):
    return b.op("or.b32", b.op("and.b32", b.op("shr.u32", s2, Imm(4, "u32")), Imm(0x0F0F0F0F, "b32")),
                b.op("and.b32", b.op("shr.u32", s1, Imm(2, "u32")), Imm(0x30303030, "b32")))


class RegDecoder:
    """The register decode of the few-token tensor-core kernels (gemv_q4_k_mma_t*, mmq_q4_k_rega_n*): lane (g, t)
    owns qs chunk t of rows g, g + 8 (of each m16 tile) in a ring stage of BLOCK_BYTES-byte rows; its constants
    (emitted on construction, in this order) and header() / row_words() / dequant(). BLOCK / QS: the block's bytes
    and its qs offset (a subclass's format: q5_k.RegDecoder)."""

    BLOCK, QS = BLOCK_BYTES, HEADER_BYTES
    HI_SCALED = True  # dequant() leaves the high nibbles in place (x16): header()'s high multiplier is sc/16

    def __init__(self, b, g, t):
        self.b = b
        self.magic = b.op("mov.b32", Imm(0x64006400, "b32"))
        self.h16 = b.op("mov.b32", Imm(0x2C002C00, "b32"))  # (1/16, 1/16) fp16
        self.n1024 = b.op("mov.b32", Imm(0xE400E400, "b32"))  # (-1024, -1024) fp16
        self.zero = b.op("mov.b32", Imm(0, "b32"))
        self.czero = [b.op("mov.f32", Imm(0.0, "f32")) for _ in range(4)]
        self.t_hi = b.op("setp.ge.u32", t, Imm(2, "u32"))
        tb = b.op("shl.b32", b.op("and.b32", t, Imm(1, "b32")), Imm(1, "u32"))  # byte 2t % 4 of the sc / m word
        self.sel_lo = b.op("mad.lo.u32", tb, Imm(0x101, "u32"), Imm(0x5050, "u32"))  # bytes (sc_2t, 0x64, sc_2t, 0x64)
        self.sel_hi = b.op("mad.lo.u32", tb, Imm(0x101, "u32"), Imm(0x5151, "u32"))  # sc_2t+1
        self.msel = b.op("mad.lo.u32", tb, Imm(0x101, "u32"), Imm(0x5150, "u32"))  # (m_2t, 0x64, m_2t+1, 0x64)
        self.lane_hdr = b.op("mul.lo.u32", g, Imm(self.BLOCK, "u32"))  # row g's header in a stage
        self.lane_qs = b.op("mad.lo.u32", t, Imm(32, "u32"), b.op("add.u32", self.lane_hdr, Imm(self.QS, "u32")))

    def header(self, st, ro):
        """Row ro of the stage: d, −64·dmin (the min pairs carry 2^-6), (mult, add) of sub-blocks 2t (low nibbles:
        mult = sc) and 2t + 1 (high: sc/16), add = −1024·mult, and the min MMA's A pair (m_2t, m_2t+1)."""
        b, magic = self.b, self.magic
        hw = b.regs("b32", 4)
        b.emit("ld.shared.v4.u32", b.vec(hw), Mem(b.op("add.u32", st, self.lane_hdr), self.BLOCK * ro))
        dlo, dhi = b.reg("b16"), b.reg("b16")
        b.emit("mov.b32", b.vec([dlo, dhi]), hw[0])
        s0, s1, s2 = hw[1:]
        sc = b.op("selp.b32", scales_4_7(b, s0, s2), scales_0_3(b, s0), self.t_hi)  # sub-blocks 4-7 : 0-3
        m = b.op("selp.b32", mins_4_7(b, s1, s2), mins_0_3(b, s1), self.t_hi)
        mult_lo = b.op("sub.rn.f16x2", b.op("prmt.b32", sc, magic, self.sel_lo), magic, type="b32")
        mult_hi = b.op("sub.rn.f16x2", b.op("prmt.b32", sc, magic, self.sel_hi), magic, type="b32")
        if self.HI_SCALED:  # the high nibbles decode to 1024 + 16q: their multiplier is sc/16
            mult_hi = b.op("mul.rn.f16x2", mult_hi, self.h16, type="b32")
        return dict(d=b.op("cvt.f32.f16", dlo), nd64=b.op("mul.rn.f32", b.op("cvt.f32.f16", dhi), Imm(-64.0, "f32")),
                    lo=(mult_lo, b.op("mul.rn.f16x2", mult_lo, self.n1024, type="b32")),
                    hi=(mult_hi, b.op("mul.rn.f16x2", mult_hi, self.n1024, type="b32")),
                    ma=b.op("sub.rn.f16x2", b.op("prmt.b32", m, magic, self.msel), magic, type="b32"))

    def row_words(self, st, off):
        """The lane's 8 words of a row at byte `off` of the stage at `st` (its qs chunk: two 16-byte loads); each is
        one dequant() argument."""
        b = self.b
        words = b.regs("b32", 8)
        for h in range(2):
            b.emit("ld.shared.v4.u32", b.vec(words[4 * h:4 * h + 4]), Mem(b.op("add.u32", st, self.lane_qs), off + 16 * h))
        return words

    def word_at(self, qsp, off):
        """One dequant() argument: the word at byte `off` from `qsp` (the lane's qs chunk in a stage, + 4i)."""
        return self.b.op("ld.shared.u32", Mem(qsp, off))

    def dequant(self, w, pair):
        """The word's 8 weights as A halves q·sc: (bytes 0, 2), (bytes 1, 3) of the low nibbles and of the high."""
        b = self.b
        w8 = b.op("shr.u32", w, Imm(8, "u32"))
        out = {}
        for nib, mask in (("lo", 0x000F000F), ("hi", 0x00F000F0)):
            mult, add = pair[nib]
            for k2, src in enumerate((w, w8)):
                h_ = b.reg("b32")
                b.emit("lop3.b32", h_, src, Imm(mask, "b32"), self.magic, Imm(0xEA, "b32"))  # (src & mask) | 0x6400
                out[nib, k2] = b.op("fma.rn.f16x2", h_, mult, add, type="b32")
        return out


class I8A:
    """The int8 few-token GEMVs' A operands (kernels/gemv_t1.py _I8Step): one ldmatrix.x4 of an m16 tile's 32 qs bytes
    of 64-weight group q (QS + 32q of each row; register i = (row g, k 4t ..), (g + 8, ..), (g, 16 + 4t ..), (g + 8,
    ..): the m16n8k32 A fragment with k = the byte) gives sub-block 2q in the low nibbles, 2q + 1 in the high: A_lo
    = a & 0x0F0F0F0F (q), A_hi = a & 0xF0F0F0F0 (16q, HI16: the caller scales the low sums by 16 instead)."""

    QS = HEADER_BYTES
    HI16 = True

    def __init__(self, b, arch, lm):
        self.b, self.arch, self.lm = b, arch, lm  # lm: the lane's ldmatrix row address of the qs bytes in a stage

    def tile(self, st, mt_off):
        """Per step and m16 tile (the stage at st, the tile's rows at mt_off from the lane's ldmatrix row): nothing."""
        return None

    def group(self, a, q, ctx):
        b = self.b
        return ([b.op("and.b32", r, Imm(0x0F0F0F0F, "b32")) for r in a],
                [b.op("and.b32", r, Imm(0xF0F0F0F0, "b32")) for r in a])


def dequant_lane(b, w, group, lane, count, f32: bool = False):
    """A warp's step over 256 weights (kernels/dequantize.py, kernels/gemv_codec.py): super-block `group` of the
    weights at `w`; lane L owns qs word L — 4 low nibbles of sub-block 2c and 4 high nibbles of 2c + 1 (c = L / 8)
    — in float32 exactly as ggml, then rounded to fp16 (f32: kept in float32). Returns (runs of f16x2 words, or of
    f32 values, offsets(): (the first run's element index, each run's element delta), None: every lane is
    valid)."""
    block = b.op("mad.wide.u32", group, Imm(BLOCK_BYTES, "u32"), w)
    chunk = b.op("shr.u32", lane, Imm(3, "u32"))
    sub_lo = b.op("shl.b32", chunk, Imm(1, "u32"))
    env = {"block": block, "sub_lo": sub_lo, "sub_hi": b.op("add.u32", sub_lo, Imm(1, "u32")),
           "qword": b.op("ld.global.nc.u32", Mem(b.op("mad.wide.u32", lane, Imm(4, "u32"), block), HEADER_BYTES))}
    if f32:
        dequant_word().lower(b, env)
    else:
        dequant_word().then(ConvertHalf("w_lo", "h_lo"), ConvertHalf("w_hi", "h_hi")).lower(b, env)

    def offsets():  # the low-nibble run: 256·group + 64·c + 4·(L % 8); the high run is 32 further
        p = b.op("shl.b32", b.op("and.b32", lane, Imm(7, "b32")), Imm(2, "u32"))
        first = b.op("add.u32", b.op("shl.b32", group, Imm(8, "u32")), b.op("mad.lo.u32", chunk, Imm(64, "u32"), p))
        return first, (0, 32)
    return ([env["w_lo"], env["w_hi"]] if f32 else [env["h_lo"], env["h_hi"]]), offsets, None



WIDE_BLOCKS = 2  # dequant_lane_wide: a warp step covers 2 blocks, 16 weights a lane


def dequant_lane_wide(b, w, group, lane, count, f32: bool = True):
    """The GEMVs' wider step: _common.kquant_lane_wide (16 weights a lane, factored runs)."""
    return kquant_lane_wide(b, w, group, lane, count, fmt=FMT, block_bytes=BLOCK_BYTES, qs_offset=HEADER_BYTES)

def run8_head(b, row, k0, fmt: str = FMT, block_bytes: int = BLOCK_BYTES):
    """The K-quants' (Q4_K, Q5_K) random access to weights k0 .. k0 + 7: (k0 within its super-block, the 64-column
    chunk c, its half hi (0: low nibbles, sub-block 2c; 1: high, 2c + 1), env with the super-block's address and
    d1 = d·sc, m1 = dmin·m of that sub-block in float32, as ggml forms them)."""
    kin = b.op("and.b32", k0, Imm(BLOCK_K - 1, "b32"))
    c = b.op("shr.u32", kin, Imm(6, "u32"))
    hi = b.op("and.b32", b.op("shr.u32", kin, Imm(5, "u32")), Imm(1, "b32"))
    block = b.op("mad.wide.u32", b.op("shr.u32", k0, Imm(8, "u32")), Imm(block_bytes, "u32"), row)
    env = {"block": block, "sub": b.op("add.u32", b.op("shl.b32", c, Imm(1, "u32")), hi)}
    DequantSequence(fmt, (LoadWords("hdr", 0, 4), SplitHalves("hdr", 0, ("d", "dmin")),
                          DecodeScaleMin6("hdr", 1, "sub", ("sc", "m")), ScaleProduct("d", "sc", "d1"),
                          ScaleProduct("dmin", "m", "m1"))).lower(b, env)
    return kin, c, hi, env


def run8_pair(b, row, k0):
    """run8 at k0 and at k0 + 32 (k0 % 64 < 32): the low and the high nibbles of the same 8 qs bytes, sub-blocks 2c
    and 2c + 1, from one header decode and one 8-byte load (dequantize_<fmt>_frags: a thread's two runs)."""
    kin = b.op("and.b32", k0, Imm(BLOCK_K - 1, "b32"))
    c = b.op("shr.u32", kin, Imm(6, "u32"))
    block = b.op("mad.wide.u32", b.op("shr.u32", k0, Imm(8, "u32")), Imm(BLOCK_BYTES, "u32"), row)
    qw = b.regs("b32", 2)
    b.emit("ld.global.nc.v2.u32", b.vec(qw), Mem(b.op("add.s64", block, b.op("cvt.u64.u32", b.op(
        "add.u32", b.op("shl.b32", c, Imm(5, "u32")), b.op("and.b32", kin, Imm(31, "b32"))))), HEADER_BYTES))
    sub_lo = b.op("shl.b32", c, Imm(1, "u32"))
    env = {"block": block, "sub_lo": sub_lo, "sub_hi": b.op("add.u32", sub_lo, Imm(1, "u32")), "qword": qw[0],
           "qword2": qw[1]}
    dequant_word().lower(b, env)  # bytes 0-3: w_lo (k0 + 0..3), w_hi (k0 + 32 + 0..3)
    DequantSequence(FMT, (UnpackNibbles("qword2", ("q_lo2", "q_hi2")), ApplyScaleMin("q_lo2", "d_lo", "min_lo", "w_lo2"),
                          ApplyScaleMin("q_hi2", "d_hi", "min_hi", "w_hi2"))).lower(b, env)
    return env["w_lo"] + env["w_lo2"], env["w_hi"] + env["w_hi2"]


class UnitLane:
    """Q4_K in kernels/gemv.py's 8-weight-unit GEMV (gemv_q4_k_t4, _t8): lane L of a warp step's 256 columns takes
    qs word L of the super-block — columns 64·c + 4·(L % 8) + 0..3 (low nibbles, sub-block 2c) and + 32 (high
    nibbles, 2c + 1), c = L / 8 — with the header's 4 words for its two (sc, m) pairs. Values 0..15 (the table),
    the min term from the activations' per-half sums."""
    LUT = tuple(range(16))  # the GEMV's 16-entry value table: the nibble itself
    ACT_SECOND = 128  # bytes from the unit's first 4 activations to its other 4 (columns 32 + p)
    MIN_TERM = True

    @staticmethod
    def row_bytes(b, K):
        return b.op("mul.lo.u32", b.op("shr.u32", K, Imm(8, "u32")), Imm(BLOCK_BYTES, "u32"))

    def __init__(self, b, lane, K):
        chunk_c = b.op("shr.u32", lane, Imm(3, "u32"))  # 64-column group c: sub-blocks 2c, 2c+1
        p4 = b.op("shl.b32", b.op("and.b32", lane, Imm(7, "b32")), Imm(2, "u32"))
        self.col_in_chunk = b.op("mad.lo.u32", chunk_c, Imm(64, "u32"), p4)
        self.sub_lo = b.op("shl.b32", chunk_c, Imm(1, "u32"))
        self.sub_hi = b.op("add.u32", self.sub_lo, Imm(1, "u32"))
        self.nunits = b.op("shr.u32", K, Imm(3, "u32"))
        self.lane = lane

    @staticmethod
    def regs(b):
        """A row's load registers: (the qs word, the header's 4 words)."""
        return b.reg("b32"), b.regs("b32", 4)

    def load(self, b, c, rowptr, regs, live):
        """Chunk c's loads of one row (zero where the lane is past the row)."""
        qw, extra = regs
        sbp = b.op("mad.wide.u32", c, Imm(BLOCK_BYTES, "u32"), rowptr)
        for h in extra + [qw]:
            b.emit("mov.b32", h, Imm(0, "b32"))
        b.emit("ld.global.nc.v4.u32", b.vec(extra), Mem(sbp), pred=live)
        b.emit("ld.global.nc.u32", qw, Mem(b.op("mad.wide.u32", self.lane, Imm(4, "u32"), sbp), 16), pred=live)

    @staticmethod
    def element(e):
        """Unit element e: (low or high nibbles, byte): e < 4 the low nibbles of bytes 0..3, e ≥ 4 the high ones."""
        return ("lo" if e < 4 else "hi"), e % 4

    def groups(self, b, regs):
        """[(elements, scale, min)]: elements 0-3 by sub-block 2c's d·sc and dmin·m, 4-7 by 2c + 1's."""
        d1, dm1, d2, dm2 = lane_scales(b, regs[1], self.sub_lo, self.sub_hi)
        return [(range(0, 4), d1, dm1), (range(4, 8), d2, dm2)]


# launch bounds (CTAs an SM by T) of the K-quant lanes that hold 19-20 words of weights (Q5_K's, Q6_K's): at
# GGML_MIN_CTAS' 8 (64 registers) their one-token builds spill
WIDE_LANE_MIN_CTAS = {1: 6, 2: 5, 4: 3, 8: 2}


class GgmlLane:
    """Q4_K in kernels/gemv.py's MMVQ-style lane GEMV (build_lanes_ggml: gemv_q4_k_t1 / _t2 exact on fp32
    activations, gemv_q4_k_fast_t* on Q8_1 with dp4a): a lane owns a pair of sub-blocks (64 weights: the 32 qs
    bytes they share, two 16-byte loads) and its super-block header (one 16-byte load); low nibbles are
    sub-block 2j, high nibbles 2j + 1. dp4a: y += d·sc·d_a·Σq·q_a − dmin·m·d_a·Σq_a per sub-block, Σq_a the
    block sums prep_q8_lanes stores beside the d (exact integers: a third of the dp4a per token less); exact:
    ggml's w = (d·sc)·q − dmin·m per element in fp32 (q as float by prmt into 0x4B000000 and one exact
    subtraction of 2^23), an FFMA per weight and token."""
    ROWS = 1  # rows per warp: 12 words of weights per row and step (x2 in flight) fit 64 registers at one row
    WORDS = 12
    K_MULTIPLE, LANE_COLS = 256, 64
    ALIGN = 16
    EXACT = True  # has the fp32-activation build
    BLOCK_BYTES = BLOCK_BYTES  # a super-block's (the K-quant lanes after it: theirs)

    @classmethod
    def sizes(cls, b, K, nblk):
        """(units a row: 64 weights each, row bytes)."""
        nunits = b.op("shr.u32", K, Imm(6, "u32"))
        return nunits, b.op("mul.lo.u32", b.op("shr.u32", K, Imm(8, "u32")), Imm(cls.BLOCK_BYTES, "u32"))


    def __init__(self, b, lane):
        # this lane's activation blocks 2P, 2P+1 sit in group (2·jb + 2·lane) / 32 at columns 2·lane % 32, +1
        self.col = b.op("and.b32", b.op("shl.b32", lane, Imm(1, "u32")), Imm(31, "b32"))
        self.sub_lo = b.reg("u32")
        self.sub_hi = b.reg("u32")

    def load(self, b, u, rowptr, regs, pred):
        """Unit u of a row: the header (16 B), then the pair's 32 qs bytes at 16 + 32·(u % 4)."""
        sb = b.op("add.s64", rowptr, b.op("mul.wide.u32", b.op("shr.u32", u, Imm(2, "u32")), Imm(BLOCK_BYTES, "u32")))
        qp = b.op("add.s64", sb, b.op("cvt.u64.u32", b.op("shl.b32", b.op("and.b32", u, Imm(3, "b32")), Imm(5, "u32"))))
        b.emit("ld.global.nc.v4.u32", b.vec(regs[0:4]), Mem(sb), pred=pred)
        b.emit("ld.global.nc.v4.u32", b.vec(regs[4:8]), Mem(qp, 16), pred=pred)
        b.emit("ld.global.nc.v4.u32", b.vec(regs[8:12]), Mem(qp, 32), pred=pred)

    def act(self, b, u, actptr, gsize, pred, tail):
        """A token's Q8_1 activation of unit u: its two blocks' qs words (8 each) and their d."""
        g = b.op("shr.u32", u, Imm(4, "u32"))  # group of block 2P: 2P / 32
        base = b.op("add.s64", actptr, b.op("mul.wide.u32", g, Imm(gsize, "u32")))
        cb = b.op("add.s64", base, b.op("mul.wide.u32", self.col, Imm(16, "u32")))
        words = []
        for row_off in (0, 512):  # words 0..3 of both blocks, then 4..7
            wv = b.regs("b32", 8)
            if tail:
                for reg in wv:
                    b.emit("mov.b32", reg, Imm(0, "b32"))
            b.emit("ld.global.nc.v4.u32", b.vec(wv[0:4]), Mem(cb, row_off), pred=pred)
            b.emit("ld.global.nc.v4.u32", b.vec(wv[4:8]), Mem(cb, row_off + 16), pred=pred)
            words.append(wv)
        blk = [words[0][0:4] + words[1][0:4], words[0][4:8] + words[1][4:8]]
        dv, sv = b.regs("f32", 2), b.regs("f32", 2)
        if tail:
            for reg in dv + sv:
                b.emit("mov.f32", reg, Imm(0.0, "f32"))
        cp = b.op("add.s64", base, b.op("mul.wide.u32", self.col, Imm(4, "u32")))
        b.emit("ld.global.nc.v2.f32", b.vec(dv), Mem(cp, 1024), pred=pred)
        b.emit("ld.global.nc.v2.f32", b.vec(sv), Mem(cp, LANE_SUMS), pred=pred)  # the blocks' Σq_a (prep_q8_lanes)
        return blk, dv, sv

    def _subs(self, b, u):
        b.emit("shl.b32", self.sub_lo, b.op("and.b32", u, Imm(3, "b32")), Imm(1, "u32"))
        b.emit("add.u32", self.sub_hi, self.sub_lo, Imm(1, "u32"))

    def quants(self, b, regs, h):
        """The 8 words of four q = 0..15 each of sub-block 2j + h (h = 0: the low nibbles, 1: the high ones)."""
        return [b.op("and.b32", q if h == 0 else b.op("shr.u32", q, Imm(4, "u32")), Imm(0x0F0F0F0F, "b32"))
                for q in regs[4:12]]

    def compute(self, b, u, ws, acts, acc, ones):
        """dp4a over the step's unit of each row `ws[r]` and token (acts[t] = act()), into acc[r][t]: y +=
        d·sc·d_a·Σq·q_a − dmin·m·d_a·Σq_a per sub-block, its q from `quants`."""
        self._subs(b, u)
        asum = [acts[t][2] for t in range(len(acts))]  # Σq_a per block, from the prep (exact integers in fp32)
        for r, regs in enumerate(ws):
            dlo, mlo, dhi, mhi = lane_scales(b, regs[0:4], self.sub_lo, self.sub_hi)
            for h, (scale, mn) in enumerate(((dlo, mlo), (dhi, mhi))):
                nib = self.quants(b, regs, h)
                for t in range(len(acts)):
                    wv, dv = acts[t][0][h], acts[t][1][h]
                    s_ = Imm(0, "s32")
                    for i in range(8):
                        s_ = b.op("dp4a.u32.s32", nib[i], wv[i], s_, type="s32")
                    # d·sc·d_a·Σ q·q_a − dmin·m·d_a·Σ q_a
                    t1 = b.op("mul.rn.f32", b.op("mul.rn.f32", scale, dv), b.op("cvt.rn.f32.s32", s_))
                    t2 = b.op("mul.rn.f32", b.op("mul.rn.f32", mn, dv), asum[t][h])
                    b.emit("add.rn.f32", acc[r][t], acc[r][t], b.op("sub.rn.f32", t1, t2))

    def compute_exact(self, b, u, ws, actptr, gsize, acc, magic, pred, tail):
        """fp32 activations: chunk c (0..7) of the lane layout holds elements 4c..4c+3 of blocks 2P (sub-block
        lo: low nibbles of qs word c) and 2P+1 (sub-block hi: its high nibbles), 32 contiguous bytes."""
        R, Tn = len(ws), len(actptr)
        self._subs(b, u)
        g = b.op("shr.u32", u, Imm(4, "u32"))
        cbs = [b.op("add.s64", b.op("add.s64", actptr[t], b.op("mul.wide.u32", g, Imm(gsize, "u32"))),
                    b.op("mul.wide.u32", self.col, Imm(16, "u32"))) for t in range(Tn)]
        scales = [lane_scales(b, ws[r][0:4], self.sub_lo, self.sub_hi) for r in range(R)]
        two23 = Imm(8388608.0, "f32")
        for c in range(8):
            nibs = []
            for r in range(R):
                qw = ws[r][4 + c]
                nibs.append((b.op("and.b32", qw, Imm(0x0F0F0F0F, "b32")),
                             b.op("and.b32", b.op("shr.u32", qw, Imm(4, "u32")), Imm(0x0F0F0F0F, "b32"))))
            for half in range(2):  # sub-block lo (block 2P) then hi (2P+1): 4 floats per token live at a time
                xs = []
                for t in range(Tn):
                    v = [b.reg("f32") for _ in range(4)]
                    if tail:
                        for r_ in v:
                            b.emit("mov.f32", r_, Imm(0.0, "f32"))
                    b.emit("ld.global.nc.v4.f32", b.vec(v), Mem(cbs[t], 512 * c + 16 * half), pred=pred)
                    xs.append(v)
                for r in range(R):
                    dsc, dm = (scales[r][0], scales[r][1]) if half == 0 else (scales[r][2], scales[r][3])
                    for i in range(4):
                        f = b.op("prmt.b32", nibs[r][half], magic, Imm(0x7540 | i, "b32"), type="f32")
                        wv = b.op("fma.rn.f32", dsc, b.op("sub.rn.f32", f, two23), b.op("neg.f32", dm))
                        for t in range(Tn):
                            b.emit("fma.rn.f32", acc[r][t], wv, xs[t][i], acc[r][t])


class RegA:
    """The nibble codecs' register-A decode for the wgmma MMQs (kernels/mmq.py _rega_steps; Q4_K, and Q5_K with
    `qh`): lane (g, t) of consumer warp cw decodes rows 16·cw + g and + 8, qs bytes 8t..8t+7 (16 weights each: low
    nibbles sub-block 2c, high 2c + 1 of the step's pair) of a K-step's raw columns — the header, [the two qh
    columns,] the pair's qs bytes 0-15 and 16-31, `part` bytes each — straight into wgmma's A fragments, in the K
    order of layouts.q4k_rega_k_order, three instructions per two weights (dequant_pair3). The 4 lanes of a row
    pair decode one (row, sub-block) scale each (scale_ints) and share them by shfl. `qh` (Q5_K): the lane's qh
    bytes 8t..8t+7 give each weight its fifth bit (bit 2c of the byte for sub-block 2c, 2c + 1 for the other),
    moved under the nibble by two instructions per two weights (bit 4 of a low-nibble half: 1024 + q; bit 8 of a
    high-nibble one: 1024 + 16·q, whose 1/16 is in sc'), so q ≤ 31 and q·sc stay exact. The constructor emits the
    lane's offsets (once, ahead of the K loop); fragments() a step's decode."""

    def __init__(self, b, lane, cw, s, part: int, qh: bool = False, s_begin=None, block_scales: bool = True,
                 row_box: tuple | None = None, integer: bool = False, natural: bool = False, min_lo: bool = False):
        self.s, self.qh = s, qh
        self.min_lo = min_lo  # dequant_pair2: −m_lo left to the caller's min-term MMA (min_fragments' lo)
        self.natural, self.part = natural, part  # natural: x in its own K order (_common.natural_words)
        self.integer = integer  # A = q·sc' alone (IntA: d and the min term applied outside the MMA)
        self.block_scales = RA_BLOCK_SCALES and block_scales
        g = b.op("shr.u32", lane, Imm(2, "u32"))
        t = b.op("and.b32", lane, Imm(3, "b32"))
        row0 = b.op("mad.lo.u32", cw, Imm(16, "u32"), g)  # this lane's rows in the 128-row tile: row0, row0 + 8
        own_rr = b.op("shr.u32", t, Imm(1, "u32"))  # the (row, sub-block) scale this lane decodes: row0 + 8·(t >> 1),
        self.own_sb = b.op("and.b32", t, Imm(1, "b32"))  # sub-block 2c + (t & 1)
        self.row_box = row_box
        if row_box is not None:  # (pitch, qs offset, qh offset): the block's rows, `pitch` bytes apart (one TMA box)
            self.own_hdr = b.op("mul.lo.u32", b.op("mad.lo.u32", own_rr, Imm(8, "u32"), row0), Imm(row_box[0], "u32"))
        else:
            self.own_hdr = b.op("shl.b32", b.op("mad.lo.u32", own_rr, Imm(8, "u32"), row0), Imm(4, "u32"))
        self.own_scale = None if self.block_scales else b.op("selp.f32", Imm(1.0 / 16, "f32"), Imm(1.0, "f32"),
                                                           b.op("setp.ne.u32", self.own_sb, Imm(0, "u32")))
        self.quad = b.op("and.b32", lane, Imm(~3 & 0xFFFFFFFF, "b32"))
        self.neg1024 = b.op("mov.b32", Imm(NEG_1024_F16X2, "b32"))
        if natural:
            self._natural_offsets(b, t, row0, qh)
        elif row_box is not None:
            self._row_box_offsets(b, t, row0, qh)
        else:
            # qs bytes 8t..8t+7 of row r: part 1 (bytes 0-15) or 2 (16-31) of the raw stage, 16 bytes per row
            qs_off = [b.op("add.u32", b.op("mad.lo.u32", b.op("add.u32", row0, Imm(8 * rr, "u32")), Imm(16, "u32"),
                                           b.op("shl.b32", b.op("and.b32", t, Imm(1, "b32")), Imm(3, "u32"))),
                             b.op("mul.lo.u32", b.op("add.u32", own_rr, Imm(1, "u32")), Imm(part, "u32")))
                      for rr in range(2)]
            self.qh_off = None
            if qh:  # the qs columns come after the two qh ones; the lane's qh bytes sit where its qs bytes did
                self.qh_off = qs_off
                qs_off = [b.op("add.u32", o, Imm(2 * part, "u32")) for o in qs_off]
            self.qs_off = qs_off
        self.s_begin = s_begin
        if self.block_scales:  # the lane's block registers (set at each block's first step; zero until then)
            self.blk = [b.op("mov.b32", Imm(0, "b32")) for _ in range(8)]  # sc' 0-1, 2-3, −m hi, lo, d rows 0, 1

    def _row_box_offsets(self, b, t, row0, qh):
        """The lane's offsets in a row-major block box (row_box = (pitch, qs offset, qh offset)): qs bytes 8t..8t+7
        of sub-block pair 0 (pair c: 32·c further: fragments' qs_shift) and the qh bytes 8t..8t+7 (every pair's
        fifth bits) of rows row0 and row0 + 8; IntA also the two rows' headers (min_fragments)."""
        pitch, qs_at, qh_at = self.row_box
        self.t = t
        self.row_hdr = [b.op("mul.lo.u32", b.op("add.u32", row0, Imm(8 * rr, "u32")), Imm(pitch, "u32"))
                        for rr in range(2)] if self.integer or self.min_lo else None
        rows = [b.op("mad.lo.u32", b.op("add.u32", row0, Imm(8 * rr, "u32")), Imm(pitch, "u32"),
                     b.op("shl.b32", t, Imm(3, "u32"))) for rr in range(2)]
        self.qs_off = [b.op("add.u32", r, Imm(qs_at, "u32")) for r in rows]
        self.qh_off = [b.op("add.u32", r, Imm(qh_at, "u32")) for r in rows] if qh else None

    def _natural_offsets(self, b, t, row0, qh):
        """The natural K order's lane offsets: byte 2t of the step's first 16 qs bytes of rows row0 and row0 + 8
        (and of their qh bytes): _common.natural_words reads 2 bytes there, 8 further, and the same in the next 16."""
        self.t = t
        if self.row_box is not None:
            pitch, qs_at, qh_at = self.row_box
            self.row_hdr = [b.op("mul.lo.u32", b.op("add.u32", row0, Imm(8 * rr, "u32")), Imm(pitch, "u32"))
                            for rr in range(2)] if self.integer or self.min_lo else None
            rows = [b.op("mad.lo.u32", b.op("add.u32", row0, Imm(8 * rr, "u32")), Imm(pitch, "u32"),
                         b.op("shl.b32", t, Imm(1, "u32"))) for rr in range(2)]
            self.nat_next = 16  # the second 16 qs bytes: the next 16 of the row
        else:  # the step's 16-byte columns: [header,] [qh lo, qh hi,] qs lo, qs hi — row r's 16 bytes of each
            rows = [b.op("mad.lo.u32", b.op("add.u32", row0, Imm(8 * rr, "u32")), Imm(16, "u32"),
                         b.op("shl.b32", t, Imm(1, "u32"))) for rr in range(2)]
            qs_at, qh_at = (3 if qh else 1) * self.part, self.part
            self.nat_next = self.part  # the next column
        self.qs_off = [b.op("add.u32", r, Imm(qs_at, "u32")) for r in rows]
        self.qh_off = [b.op("add.u32", r, Imm(qh_at, "u32")) for r in rows] if qh else None

    def _block_scales(self, b, rbase, magic, static: bool = False):
        """At a block's first step (or the item's): the lane's (row, parity p) header → sc'·(1 or 1/16) of its
        sub-blocks p, p + 2, p + 4, p + 6 as two f16x2 pairs, −dmin·m split into fp16 hi and lo pairs the same way
        (mul then fma: each rounds the exact product once, as scale_ints' fp32 forms do), and d of both rows
        (from the quad's lanes 0 and 2) as broadcasts, into self.blk. ~30 instructions a block, not a step."""
        kept = None if static else b.label("ra_block_kept")  # static: the caller emits this at the block's step 0
        if kept is not None:
            first = b.op("or.pred", b.op("setp.eq.u32", self.s, self.s_begin),
                         b.op("setp.eq.u32", b.op("and.b32", self.s, Imm(3, "b32")), Imm(0, "u32")))
            b.bra(kept, pred=first, neg=True)
        hdr = b.regs("b32", 4)
        b.emit("ld.shared.v4.b32", b.vec(hdr), Mem(b.op("add.u32", rbase, self.own_hdr)))
        p = self.own_sb  # sub-blocks p, p + 2, p + 4, p + 6: bytes p, p + 2 of the 0-3 word and of the 4-7 one
        # (pick, dsc, ndsc are lane constants formed again each block: kept in registers they spilled the n64 MoE
        # build at its 80)
        pick = b.op("mad.lo.u32", p, Imm(0x1111, "u32"), Imm(0x6420, "u32"))
        sixteenth = b.op("setp.ne.u32", p, Imm(0, "u32"))
        dsc = b.op("selp.b32", Imm(0x2C002C00, "b32"), Imm(0x3C003C00, "b32"), sixteenth)  # 1/16 or 1
        ndsc = b.op("selp.b32", Imm(0xD400D400, "b32"), Imm(NEG_1024_F16X2, "b32"), sixteenth)  # −1024·dsc
        scw = b.op("prmt.b32", scales_0_3(b, hdr[1]), scales_4_7(b, hdr[1], hdr[3]), pick)
        mw = b.op("prmt.b32", mins_0_3(b, hdr[2]), mins_4_7(b, hdr[2], hdr[3]), pick)
        ndmin = b.op("xor.b32", b.op("prmt.b32", hdr[0], hdr[0], Imm(0x3232, "b32")), Imm(0x80008000, "b32"))
        sc01, sc23, mh01, mh23, ml01, ml23, d0, d1 = self.blk
        for lo, (sc_out, mh_out, ml_out) in ((True, (sc01, mh01, ml01)), (False, (sc23, mh23, ml23))):
            sel = Imm(0x7150 if lo else 0x7352, "b32")  # bytes (0, 1) or (2, 3) under 0x64: 1024 + v halves
            b.emit("fma.rn.f16x2", sc_out, b.op("prmt.b32", scw, magic, sel), dsc, ndsc)
            if self.integer:  # (the min term is IntA's own MMA: min_fragments)
                continue
            m = b.op("sub.rn.f16x2", b.op("prmt.b32", mw, magic, sel), magic, type="b32")  # m exact
            b.emit("mul.rn.f16x2", mh_out, m, ndmin)
            if not self.min_lo:  # (min_lo: the caller's min-term MMA takes −m_lo)
                b.emit("fma.rn.f16x2", ml_out, m, ndmin, b.op("xor.b32", mh_out, Imm(0x80008000, "b32")))
        dd = b.op("prmt.b32", hdr[0], hdr[0], Imm(0x1010, "b32"))  # (d, d) of this lane's row
        for rr, dst in ((0, d0), (1, d1)):
            b.emit("shfl.sync.idx.b32", dst, dd, b.op("or.b32", self.quad, Imm(2 * rr, "b32")), Imm(0x1F, "b32"),
                   Imm(0xFFFFFFFF, "b32"))
        if kept is not None:
            b.place(kept)

    def min_fragments(self, b, rbase, magic):
        """IntA's min-term A operands of the block at `rbase` (a row box): lane (g, t)'s −dmin·m of sub-blocks 2t,
        2t + 1 of rows row0 and row0 + 8 as fp16 hi and lo pairs (mul, then fma: each rounds the exact product
        once), as two k16 slices for B = [Σx hi of sub-blocks 0-7 | Σx lo]: [hi, hi] and [lo, 0] (k 2t, 2t + 1
        and 2t + 8, 2t + 9 of rows g, g + 8). Also returns both rows' d as fp32."""
        t = self.t
        tb = b.op("shl.b32", b.op("and.b32", t, Imm(1, "b32")), Imm(1, "u32"))  # byte 2t % 4 of the m word
        msel = b.op("mad.lo.u32", tb, Imm(0x101, "u32"), Imm(0x5150, "u32"))  # bytes (tb, 0x64, tb + 1, 0x64)
        t_hi = b.op("setp.ge.u32", t, Imm(2, "u32"))
        hi, lo, d = [], [], []
        for rr in range(2):
            hw = b.regs("b32", 4)
            b.emit("ld.shared.v4.b32", b.vec(hw), Mem(b.op("add.u32", rbase, self.row_hdr[rr])))
            mw = b.op("selp.b32", mins_4_7(b, hw[2], hw[3]), mins_0_3(b, hw[2]), t_hi)
            m = b.op("sub.rn.f16x2", b.op("prmt.b32", mw, magic, msel), magic, type="b32")  # (m_2t, m_2t+1) exact
            ndmin = b.op("xor.b32", b.op("prmt.b32", hw[0], hw[0], Imm(0x3232, "b32")), Imm(0x80008000, "b32"))
            h = b.op("mul.rn.f16x2", m, ndmin, type="b32")
            hi.append(h)
            lo.append(b.op("fma.rn.f16x2", m, ndmin, b.op("xor.b32", h, Imm(0x80008000, "b32")), type="b32"))
            dh = b.reg("b16")
            b.emit("mov.b32", b.vec([dh, b.reg("b16")]), hw[0])
            d.append(b.op("cvt.f32.f16", dh))
        zero = b.op("mov.b32", Imm(0, "b32"))
        return [[hi[0], hi[1], hi[0], hi[1]], [lo[0], lo[1], zero, zero]], d

    def fragments(self, b, rbase, magic, qs_shift=None, step: int | None = None):
        """The step's A registers from the raw columns at `rbase` (qs_shift: pair c's qs columns past the step
        layout's, the block box: 2c): slice kk's registers (row g, pair 0), (g + 8, 0), (g, 1), (g + 8, 1).
        `step`: the step's place in its block where the caller knows it (items of whole blocks; RA_STATIC_STEPS)."""
        s, qh, quad, neg1024 = self.s, self.qh, self.quad, self.neg1024
        lo_mask, hi_mask = Imm(0x000F000F, "b32"), Imm(0x00F000F0, "b32")
        scales = {}  # (rr, sb) → (sc', −1024·sc', d, −m_hi, −m_lo) of row row0 + 8·rr, sub-block sb of the pair
        # (integer: (sc', −1024·sc') alone)

        def shfl(v, src):
            return b.op("shfl.sync.idx.b32", v, src, Imm(0x1F, "b32"), Imm(0xFFFFFFFF, "b32"))
        if self.block_scales:  # this step's values: half c = s & 3 of the block registers, broadcast
            static = RA_STATIC_STEPS and step is not None
            if not static or step == 0:
                self._block_scales(b, rbase, magic, static)
            sel = (Imm(0x2222 * step + 0x1010, "b32") if static else
                   b.op("mad.lo.u32", b.op("and.b32", s, Imm(3, "b32")), Imm(0x2222, "u32"), Imm(0x1010, "u32")))
            sc01, sc23, mh01, mh23, ml01, ml23, d0, d1 = self.blk
            sc_m, m_hi, m_lo = (b.op("prmt.b32", x, y, sel) for x, y in ((sc01, sc23), (mh01, mh23), (ml01, ml23)))
            ds = (d0, d1)
        else:
            hdr = b.regs("b32", 4)
            b.emit("ld.shared.v4.b32", b.vec(hdr), Mem(b.op("add.u32", rbase, self.own_hdr)))
            sub = b.op("add.u32", b.op("shl.b32", b.op("and.b32", s, Imm(3, "b32")), Imm(1, "u32")), self.own_sb)
            sc_m, m_hi, m_lo, d_m = scale_ints(b, hdr, sub, self.own_scale)
            ds = None
        for rr in range(2):
            # row row0 + 8·rr's d: from lane 4g + 2rr
            d = ds[rr] if ds else shfl(d_m, b.op("or.b32", quad, Imm(2 * rr, "b32")))
            for sb in range(2):  # from lane 4g + 2rr + sb
                src = b.op("or.b32", quad, Imm(2 * rr + sb, "b32"))
                sc = shfl(sc_m, src)
                if self.integer:
                    scales[rr, sb] = (sc, b.op("mul.rn.f16x2", sc, neg1024, type="b32"))
                    continue
                scales[rr, sb] = (sc, b.op("mul.rn.f16x2", sc, neg1024, type="b32"), d, shfl(m_hi, src),
                                  None if self.min_lo else shfl(m_lo, src))
        frag = {}  # (rr, n) → f16x2 number n of row row0 + 8·rr
        c2 = b.op("shl.b32", b.op("and.b32", s, Imm(3, "b32")), Imm(1, "u32")) if qh else None  # qh bit 2c
        for rr in range(2):
            w = None if self.natural else b.regs("b32", 2)
            qs_at = self.qs_off[rr] if qs_shift is None else b.op("add.u32", self.qs_off[rr], qs_shift)
            if self.natural:
                w = natural_words(b, b.op("add.u32", rbase, qs_at), stride=self.nat_next)
                hw = natural_words(b, b.op("add.u32", rbase, self.qh_off[rr]), stride=self.nat_next) if qh else None
            else:
                b.emit("ld.shared.v2.b32", b.vec(w), Mem(b.op("add.u32", rbase, qs_at)))
            if qh and not self.natural:
                hw = b.regs("b32", 2)
                b.emit("ld.shared.v2.b32", b.vec(hw), Mem(b.op("add.u32", rbase, self.qh_off[rr])))
            for wi in range(2):
                words = (w[wi], b.op("shr.u32", w[wi], Imm(8, "u32")))  # bytes (0, 2) and (1, 3) of the word
                if qh:  # each byte's fifth bit of sub-block 2c (sb 0) and 2c + 1 (sb 1), at bit 0 of the byte
                    fifth = [b.op("and.b32", b.op("shr.u32", hw[wi], b.op("add.u32", c2, Imm(sb, "u32"))),
                                  Imm(0x01010101, "b32")) for sb in range(2)]
                for sh in range(2):
                    for sb, mask in ((0, lo_mask), (1, hi_mask)):
                        top = magic
                        if qh:  # the bit under the nibble: bit 4 (sb 0) or bit 8 (sb 1) of each half, with 0x6400
                            shift = {(0, 0): ("shl.b32", 4), (0, 1): ("shr.u32", 4), (1, 0): ("shl.b32", 8)}.get(
                                (sb, sh))
                            v = b.op(shift[0], fifth[sb], Imm(shift[1], "u32")) if shift else fifth[sb]
                            top = b.reg("b32")
                            b.emit("lop3.b32", top, v, Imm(0x00100010 if sb == 0 else 0x01000100, "b32"), magic,
                                   Imm(0xEA, "b32"))
                        h = b.reg("b32")
                        b.emit("lop3.b32", h, words[sh], mask, top, Imm(0xEA, "b32"))  # (v & mask) | 0x6400 (| bit)
                        frag[rr, 4 * sb + 2 * wi + sh] = (
                            b.op("fma.rn.f16x2", h, *scales[rr, sb], type="b32") if self.integer else
                            dequant_pair2(b, h, scales[rr, sb]) if self.min_lo else dequant_pair3(b, h, scales[rr, sb]))
        return [[frag[0, 2 * kk], frag[1, 2 * kk], frag[0, 2 * kk + 1], frag[1, 2 * kk + 1]] for kk in range(4)]


# --- the tensor-core decode GEMV (kernels/gemv.py build_q4k_mma_gemv: gemv_q4_k_mma, gemv_q4_k_mma_n16) ---------------
MMA_ROW_BYTES = BLOCK_BYTES  # a ring row: one super-block, 36 words (rows g = 0..7 in banks 4g + t: conflict-free)
MMA_STEP_SUBS = BLOCK_K // SUB_K  # a K step: the 8 sub-blocks of one super-block


def mma_step_offset(b, sub):
    """The byte offset in a weight row of the step (super-block) holding sub-block `sub`, as u64."""
    assert MMA_STEP_SUBS == 8
    return b.op("mul.wide.u32", b.op("shr.u32", sub, Imm(3, "u32")), Imm(MMA_ROW_BYTES, "u32"))


def mma_lane_offsets(b, g, t) -> tuple:
    """Lane (g, t)'s offsets in a ring stage of MMA_ROW_BYTES rows: row g's header, and its qs word t (of each
    16 bytes; MmaGemvDecoder.qs_base). Apart from the decoder: the kernel emits its own lane terms in between."""
    hdr = b.op("mul.lo.u32", g, Imm(MMA_ROW_BYTES, "u32"))
    return hdr, b.op("mad.lo.u32", t, Imm(4, "u32"), hdr)


def mma_header(b, hw, magic, t_hi, msel) -> dict:
    """A row's header words `hw` (4, as loaded) for gemv_q4_k_mma (kernels/gemv.py): d and −64·dmin in fp32 (the
    min fragments carry 2^-6), the packed 6-bit sc bytes of sub-blocks 0-3 and 4-7, and the min MMA's A pair
    (m_2t, m_2t+1) as exact fp16 (`t_hi`: the lane's t ≥ 2, its mins from sub-blocks 4-7; `msel`: the prmt that
    places them under `magic` = 0x64006400)."""
    dlo, dhi = b.reg("b16"), b.reg("b16")
    b.emit("mov.b32", b.vec([dlo, dhi]), hw[0])
    s0, s1, s2 = hw[1:]
    sc = (scales_0_3(b, s0), scales_4_7(b, s0, s2))
    m = (mins_0_3(b, s1), mins_4_7(b, s1, s2))
    mw = b.op("selp.b32", m[1], m[0], t_hi)
    ma = b.op("sub.rn.f16x2", b.op("prmt.b32", mw, magic, msel), magic, type="b32")  # (m_2t, m_2t+1) exact
    return dict(d=b.op("cvt.f32.f16", dlo), nd64=b.op("mul.rn.f32", b.op("cvt.f32.f16", dhi), Imm(-64.0, "f32")),
                sc=sc, ma=ma)


def mma_scale_pair(b, hd, j, magic, h16, n1024):
    """(mult, add) fp16x2 of sub-block j of a mma_header: A = h·mult + add = q·sc_j exactly, for h = 1024 + q (even
    j, low nibbles: mult = sc) or 1024 + 16q (odd j, high nibbles: mult = sc / 16, `h16` = 1/16); add = −1024·mult
    (`n1024` = −1024)."""
    sel = Imm((5 << 12) | ((j & 3) << 8) | (5 << 4) | (j & 3), "b32")  # bytes (sc_j, 0x64, sc_j, 0x64)
    sc2 = b.op("sub.rn.f16x2", b.op("prmt.b32", hd["sc"][j // 4], magic, sel), magic, type="b32")  # (sc, sc)
    mult = b.op("mul.rn.f16x2", sc2, h16, type="b32") if j % 2 else sc2
    return mult, b.op("mul.rn.f16x2", mult, n1024, type="b32")


class MmaGemvDecoder:
    """Q4_K for the tensor-core GEMV (kernels/gemv.py build_q4k_mma_gemv): lane (g, t) of a warp decodes rows
    16·mt + g and + 8 of each m16 tile straight into mma.sync m16n8k16 A fragments, A = q·sc_j as exact fp16 — the
    nibble under the 0x6400 exponent by prmt + lop3 (1024 + q, or 1024 + 16q for the high nibbles), then one fused
    h·mult − 1024·mult (mma_scale_pair) — and the min term's A (m_2t, m_2t+1) from the row headers (mma_header).
    K order: lane (g, t) reads qs word 8c + 4h + t of chunk c (64 weights: sub-block 2c low, 2c + 1 high nibbles),
    elements 16h + 4t .. + 3 of both: bytes 0, 1 are A's k 2t, 2t + 1, bytes 2, 3 its k 2t + 8, 2t + 9, the order of
    the B tiles prep_mma_f16 writes. The constructor emits the constants (once, ahead of the K loop, in this
    order); `offsets` = mma_lane_offsets(b, g, t)."""

    def __init__(self, b, t, offsets):
        self.b = b
        self.lane_hdr, self.lane_q = offsets
        self.magic = b.op("mov.b32", Imm(0x64006400, "b32"))  # (1024, 1024) fp16
        self.zero = b.op("mov.b32", Imm(0, "b32"))
        self.h16 = b.op("mov.b32", Imm(0x2C002C00, "b32"))  # (1/16, 1/16) fp16
        self.n1024 = b.op("mov.b32", Imm(0xE400E400, "b32"))  # (-1024, -1024) fp16
        # the min MMA's A: row r's mins m_2t, m_2t+1 (bytes 2t % 4, + 1 of its m word t / 2) into 0x64 halves
        self.t_hi = b.op("setp.ge.u32", t, Imm(2, "u32"))  # t ≥ 2: from the m word of sub-blocks 4-7
        tb = b.op("shl.b32", b.op("and.b32", t, Imm(1, "b32")), Imm(1, "u32"))  # byte 2t % 4
        self.msel = b.op("mad.lo.u32", tb, Imm(0x101, "u32"), Imm(0x5150, "u32"))  # bytes (tb, 0x64, tb + 1, 0x64)

    def headers(self, stage_base, mtiles) -> list:
        """Per row rr of the lane (row 16·(rr // 2) + g + 8·(rr % 2)) of the stage at `stage_base`: its mma_header
        (d, −64·dmin, the sc words, the min MMA's A pair)."""
        b = self.b
        out = []
        for rr in range(2 * mtiles):
            hw = b.regs("b32", 4)
            at = b.op("add.u32", stage_base, self.lane_hdr)
            b.emit("ld.shared.v4.u32", b.vec(hw), Mem(at, 8 * MMA_ROW_BYTES * rr))
            out.append(mma_header(b, hw, self.magic, self.t_hi, self.msel))
        return out

    def qs_base(self, stage_base):
        """The lane's qs word in the stage at `stage_base` (row g, word t of each 16 bytes): fragments()' base."""
        return self.b.op("add.u32", stage_base, self.lane_q)

    def fragments(self, qb, c, mt, hds) -> dict:
        """Chunk c (sub-blocks 2c, 2c + 1) of m16 tile mt from qs_base `qb`, `hds` = the tile's two headers: per
        (sub-block 2c + sb, half h) the A fragment [(g, k 2t..), (g + 8, ..), (g, k 2t + 8..), (g + 8, ..)]."""
        b, magic = self.b, self.magic
        pairs = {(rr, sb): mma_scale_pair(b, hds[rr], 2 * c + sb, magic, self.h16, self.n1024)
                 for rr in range(2) for sb in range(2)}
        a = {}
        for rr in range(2):
            for h in range(2):
                w = b.op("ld.shared.u32", Mem(qb, HEADER_BYTES + 32 * c + 16 * h + MMA_ROW_BYTES * (16 * mt + 8 * rr)))
                for sb, mask in ((0, 0x000F000F), (1, 0x00F000F0)):
                    mult, add = pairs[rr, sb]
                    for bp, sel in enumerate((0x4140, 0x4342)):  # bytes (0, 1), (2, 3) of the word
                        v = b.op("prmt.b32", w, self.zero, Imm(sel, "b32"))
                        h_ = b.reg("b32")
                        b.emit("lop3.b32", h_, v, Imm(mask, "b32"), magic, Imm(0xEA, "b32"))  # (v & mask) | 0x6400
                        a[rr, h, sb, bp] = b.op("fma.rn.f16x2", h_, mult, add, type="b32")
        return {(sb, h): [a[0, h, sb, 0], a[1, h, sb, 0], a[0, h, sb, 1], a[1, h, sb, 1]]
                for sb in range(2) for h in range(2)}

    @staticmethod
    def min_fragment(hds) -> list:
        """The min MMA's A of an m16 tile from its two headers: (m_2t, m_2t+1) of rows g and g + 8, twice."""
        return [hds[0]["ma"], hds[1]["ma"], hds[0]["ma"], hds[1]["ma"]]

    def block_value(self, hd, cs, ms):
        """A (row, token)'s super-block in fp32: d·C − 64·dmin·MS, C = the sum of its q·sc MMAs, MS its min MMA's
        (the min fragments carry 2^-6): w = d·sc·q − dmin·m summed over the block."""
        b = self.b
        return b.op("fma.rn.f32", hd["d"], cs, b.op("mul.rn.f32", hd["nd64"], ms))


def scale_min_f32(b, hdr, sub, dscale):
    """Sub-block `sub` of the header words `hdr` → (d·sc·dscale, −dmin·m) in fp32, as ggml forms them (the Q8_1
    MMQ's scale table, Q8Scales; dscale 1/16 where the high nibbles enter as 16·q: exact)."""
    env = {"hdr": hdr, "sub": sub}
    SplitHalves("hdr", 0, ("d", "dmin")).lower(b, env)
    DecodeScaleMin6("hdr", 1, "sub", ("sc", "m")).lower(b, env)
    dsc = b.op("mul.rn.f32", env["d"], b.op("cvt.rn.f32.u32", env["sc"]))
    dsc = b.op("mul.rn.f32", dsc, dscale)
    return dsc, b.op("neg.f32", b.op("mul.rn.f32", env["dmin"], b.op("cvt.rn.f32.u32", env["m"])))


# --- the int8 x Q8_1 MMQ (kernels/mmq.py build_q8: mmq_q4_k_q8_n*, *_pre) ---------------------------------------------
# Moved out of kernels/mmq.py _q8_scales / _q8_mma on 2026-12-03 (after e09befa): the builder keeps the tiles, the
# ring, the K loop and the epilogue. Its raw ring stages hold rows of STEP_ROW_BYTES (raw_copies): header, qs 0-31.
Q8_TILE_BYTES = 16 * STEP_ROW_BYTES  # one m16 tile's rows in a ring stage
Q8_SCALE_BYTES = 8  # an entry of the builder's weight-scale table: Q8Scales.values' (d·sc, −dmin·m) in fp32


class Q8Scales:
    """The Q8_1 MMQ's weight scales: a thread's (row, sub-block 2c + `parity`) of K-step s (pair c = s % 4) as
    (d·sc, −dmin·m) in fp32, as ggml forms them (scale_min_f32), from the row's header in the step's ring stage, once
    a step. The constructor emits the thread's terms (its row's header offset, its 1/16 or 1)."""

    def __init__(self, b, row, parity):
        self.b, self.parity = b, parity
        # odd sub-blocks (high nibbles) enter the MMA as 16·q (Q8Decoder.fragment): their d·sc carries the 1/16
        self.dscale = b.op("selp.f32", Imm(1.0 / 16, "f32"), Imm(1.0, "f32"),
                           b.op("setp.ne.u32", parity, Imm(0, "u32")))
        self.hdr_off = b.op("mul.lo.u32", row, Imm(STEP_ROW_BYTES, "u32"))

    def values(self, step, stage_of):
        """K-step `step`'s (d·sc, −dmin·m); stage_of(step): its ring stage's address, emitted after the header's
        registers are taken (the order the kernel has always had)."""
        assert BLOCK_K // STEP_K == 4  # pair c = step & 3
        b = self.b
        hdr = b.regs("b32", 4)
        b.emit("ld.shared.v4.b32", b.vec(hdr), Mem(b.op("add.u32", stage_of(step), self.hdr_off)))
        sub = b.op("add.u32", b.op("shl.b32", b.op("and.b32", step, Imm(3, "b32")), Imm(1, "u32")), self.parity)
        return scale_min_f32(b, hdr, sub, self.dscale)


def q8_lane_offset(b, row, matrix):
    """A lane's ldmatrix.x4 address in a ring stage: the builder's `row` (its m16 tile row, + 8·(matrix % 2)), and
    qs bytes 16·(matrix / 2) .. + 15 of it (A's k 0-15 or 16-31). Apart from Q8Decoder: the kernel emits its B lane
    terms after it."""
    return b.op("mad.lo.u32", row, Imm(STEP_ROW_BYTES, "u32"),
                b.op("add.u32", b.op("shl.b32", b.op("shr.u32", matrix, Imm(1, "u32")), Imm(4, "u32")),
                     Imm(HEADER_BYTES, "u32")))


class Q8Decoder:
    """Q4_K as the Q8_1 MMQ's A operand (u8 x s8 mma.sync m16n8k32), read from the raw ring as it landed, no dequant
    pass. K order: k = byte i of the pair's 32 qs bytes, whose low nibble is sub-block 2c's element i and high
    nibble 2c + 1's, the order of Q8_1's 32-value blocks; so one ldmatrix.x4 of 16 rows (at q8_lane_offset) holds
    the A fragments of both sub-blocks, and `fragment` picks one by its nibble mask: q (low), 16·q (high, kept in
    place: still a u8; Q8Scales' d·sc has the 1/16). The constructor emits the two masks."""

    SUBS = 2  # sub-blocks a K-step: fragment(raw, h) and the scale table's h for h < SUBS

    def __init__(self, b):
        self.b = b
        self.masks = (b.op("mov.b32", Imm(0x0F0F0F0F, "b32")), b.op("mov.b32", Imm(0xF0F0F0F0, "b32")))

    def fragment(self, raw, h):
        """Sub-block 2c + h's A fragment from the 4 ldmatrix registers `raw` of an m16 tile."""
        return [self.b.op("and.b32", r, self.masks[h]) for r in raw]

    def accumulate(self, r, scale, x, isum):
        """acc `r` += d·sc·d_x·Σ q·q_x − dmin·m·d_x·Σ q_x (w = d·sc·q − dmin·m against x = d_x·q_x): `scale` the row's
        (d·sc, −dmin·m), `x` the token's Q8_1 (d_x, d_x·Σ q_x), `isum` the m16n8k32 integer dot."""
        b = self.b
        (dsc, ndm), (dx, dxs) = scale, x
        b.emit("fma.rn.f32", r, b.op("mul.rn.f32", dsc, dx), b.op("cvt.rn.f32.s32", isum), r)
        b.emit("fma.rn.f32", r, ndm, dxs, r)
