"""The Q5_K weight codec: GGUF's block_q5_K — d, dmin (fp16), the 12 bytes of 6-bit (scale, min) pairs Q4_K has,
qh[32] (the fifth bit: sub-block j takes bit j of qh[l] for its element l), qs[128] (the low 4 bits, as Q4_K's):
176 bytes per 256 weights, w = d·sc·q − dmin·m. The scale decode is Q4_K's (`q4_k.scale_ops`)."""
from __future__ import annotations

from ..dsl import ApplyScaleMin, ConvertHalf, DequantSequence, LoadWords, UnpackNibbles
from ..ir import Imm, Mem, ldmatrix
from ._common import alignment_error, geometry, kquant_lane_wide
from . import q4_k

FMT = "q5_K"
BLOCK_K, BLOCK_BYTES, HEADER_BYTES, QS_OFFSET = geometry(FMT, "qh", "qs")  # 256, 176, 16, 48
QH_OFFSET = HEADER_BYTES
GROUP_BLOCKS = 1
LOAD_ALIGN = 4  # dequant_lane's widest load
# the register-A wgmma builds (kernels/mmq.py _rega_steps, as Q4_K's) take 5 16-byte columns a K-step: the header,
# qh bytes 0-15 and 16-31 (every step's fifth bits), the pair's qs bytes
NIBBLE_COLUMNS = 5
RegA = q4_k.RegA  # Q4_K's register-A nibble decode, with the fifth bits (qh)
BLOCK_BOX = ("dense", "grouped")  # mmq's schedules with a block's rows in one TMA box (kernels/mmq.py NIBBLE_BLOCK_BOX)
ROW_BOX_PITCH = 176  # the block box's row pitch: the block, whose rows g = 0..3's qs loads fall in distinct banks
RA_MAP_NOTE = "per step the header, qh bytes 0-15 and 16-31, then the qs columns"
EXACT_ROUTES = ("codec_few", "mmq_ra", "mmq_pre", "mmq_f16", "codec_gemv")
ROUTES = {"exact": EXACT_ROUTES, "fast": ("fast_lanes",) + EXACT_ROUTES}  # mul_mat's routes (runtime/ops.py)
weights_error = alignment_error(FMT, 8)  # run8's v2 loads (the prepared GEMM's fragment writer)


def dequant_lane(b, w, group, lane, count, f32: bool = False):
    """dequantize_q5_k's step: lane L owns qs word L (4 low nibbles of sub-block 2c, 4 high of 2c + 1, c = L / 8)
    and qh word L % 8 (the same 4 elements' fifth bits: bit 2c, 2c + 1 of each byte); float32 as ggml, then fp16
    (f32: kept in float32). As q4_k.dequant_lane."""
    block = b.op("mad.wide.u32", group, Imm(BLOCK_BYTES, "u32"), w)
    chunk = b.op("shr.u32", lane, Imm(3, "u32"))
    sub_lo = b.op("shl.b32", chunk, Imm(1, "u32"))
    p = b.op("and.b32", lane, Imm(7, "b32"))
    env = {"block": block, "sub_lo": sub_lo, "sub_hi": b.op("add.u32", sub_lo, Imm(1, "u32")),
           "qword": b.op("ld.global.nc.u32", Mem(b.op("mad.wide.u32", lane, Imm(4, "u32"), block), QS_OFFSET)),
           "hword": b.op("ld.global.nc.u32", Mem(b.op("mad.wide.u32", p, Imm(4, "u32"), block), QH_OFFSET))}
    head = (LoadWords("hdr", 0, 4), *q4_k.scale_ops(), UnpackNibbles("qword", ("q_lo", "q_hi")))
    DequantSequence(FMT, head).lower(b, env)
    for half, sub in (("q_lo", "sub_lo"), ("q_hi", "sub_hi")):  # q + 16·(bit `sub` of qh byte i)
        env[half + "5"] = [b.op("or.b32", q, b.op("shl.b32", b.op("bfe.u32", env["hword"], b.op("add.u32", env[sub],
                                                                                             Imm(8 * i, "u32")),
                                                                     Imm(1, "u32")), Imm(4, "u32")))
                           for i, q in enumerate(env[half])]
    tail = (ApplyScaleMin("q_lo5", "d_lo", "min_lo", "w_lo"), ApplyScaleMin("q_hi5", "d_hi", "min_hi", "w_hi"))
    if not f32:
        tail += (ConvertHalf("w_lo", "h_lo"), ConvertHalf("w_hi", "h_hi"))
    DequantSequence(FMT, tail).lower(b, env)

    def offsets():  # as Q4_K's: 256·group + 64·c + 4·(L % 8), the high run 32 further
        return b.op("add.u32", b.op("shl.b32", group, Imm(8, "u32")),
                    b.op("mad.lo.u32", chunk, Imm(64, "u32"), b.op("shl.b32", p, Imm(2, "u32")))), (0, 32)
    return ([env["w_lo"], env["w_hi"]] if f32 else [env["h_lo"], env["h_hi"]]), offsets, None



class RegDecoder(q4_k.RegDecoder):
    """The few-token tensor-core kernels' register decode (kernels/gemv_t1.py, as q4_k.RegDecoder): lane (g, t) owns
    qs chunk t of rows g, g + 8 — sub-blocks 2t (low nibbles) and 2t + 1 (high) — and reads the rows' 32 qh bytes,
    whose bits 2t and 2t + 1 are those weights' fifth bits. The header, scales, mins and the min term are Q4_K's;
    both halves decode to 1024 + q5 (so the high multiplier is sc, not sc/16)."""

    BLOCK, QS = BLOCK_BYTES, QS_OFFSET
    HI_SCALED = False

    def __init__(self, b, g, t):
        super().__init__(b, g, t)
        self.lane_qh = b.op("add.u32", self.lane_hdr, Imm(QH_OFFSET, "u32"))
        t2 = b.op("shl.b32", t, Imm(1, "u32"))
        # rotations of a qh word bringing bit 2t (2t + 1) of each byte to bit 4 of that byte: by 2t − 4 (2t − 3) mod 32
        self.rot_lo = b.op("and.b32", b.op("add.u32", t2, Imm(28, "u32")), Imm(31, "b32"))
        self.rot_hi = b.op("and.b32", b.op("add.u32", t2, Imm(29, "u32")), Imm(31, "b32"))

    def row_words(self, st, off):
        """(qs word, qh word) i = 0..7 of the row at byte `off` of the stage: bytes 4i .. 4i + 3 of the lane's qs
        chunk and of qh (the same elements)."""
        b = self.b
        qs = super().row_words(st, off)
        qh = b.regs("b32", 8)
        for h in range(2):
            b.emit("ld.shared.v4.u32", b.vec(qh[4 * h:4 * h + 4]), Mem(b.op("add.u32", st, self.lane_qh), off + 16 * h))
        return list(zip(qs, qh))

    def word_at(self, qsp, off):
        """(qs word, qh word) at byte `off` from `qsp` (the lane's qs chunk in a stage, + 4i) and from the row's qh."""
        b = self.b
        if not hasattr(self, "qh_from_qs"):
            self.qh_from_qs = b.op("sub.u32", self.lane_qh, self.lane_qs)
        return (b.op("ld.shared.u32", Mem(qsp, off)),
                b.op("ld.shared.u32", Mem(b.op("add.u32", qsp, self.qh_from_qs), off)))

    def dequant(self, words, pair):
        """The word's 8 weights as A halves q5·sc: per byte, its 4 bits of the sub-block's nibble below the fifth bit
        (bit 4; a rotated qh word's bits through a 0x0F0F0F0F select, 3 junk bits above it), then Q4_K's lop3 with
        a 5-bit mask beside 0x6400 (1024 + q5, bytes 0 and 2, then 1 and 3) and the fma with (sc, −1024·sc):
        exactly q5·sc (≤ 31·63 = 1953)."""
        b = self.b
        w, qh = words
        out = {}
        for nib, src, rot in (("lo", w, self.rot_lo), ("hi", b.op("shr.u32", w, Imm(4, "u32")), self.rot_hi)):
            bits = b.reg("b32")
            b.emit("shf.r.wrap.b32", bits, qh, qh, rot)
            q5 = b.reg("b32")
            b.emit("lop3.b32", q5, src, bits, Imm(0x0F0F0F0F, "b32"), Imm(0xE4, "b32"))  # (src & c) | (bits & ~c)
            mult, add = pair[nib]
            for k2, s in enumerate((q5, b.op("shr.u32", q5, Imm(8, "u32")))):
                h_ = b.reg("b32")
                b.emit("lop3.b32", h_, s, Imm(0x001F001F, "b32"), self.magic, Imm(0xEA, "b32"))  # (s & 0x1F..) | 0x6400
                out[nib, k2] = b.op("fma.rn.f16x2", h_, mult, add, type="b32")
        return out


class I8A(q4_k.I8A):
    """Q4_K's int8 A operands (q4_k.I8A) with the fifth bits: one more ldmatrix.x4 a step and tile, of the rows'
    qh bytes (the same k layout as qs), whose bit j of byte k is element k's of sub-block j. Sub-block 2q: (a &
    0x0F0F0F0F) | (bit 2q at bit 4 of each byte); 2q + 1: ((a >> 4) & 0x0F0F0F0F) | (bit 2q + 1 at bit 4) — both
    plain q5 (≤ 31: no 16x on the high nibbles)."""

    QS = QS_OFFSET
    HI16 = False

    def __init__(self, b, arch, lm):
        super().__init__(b, arch, lm)
        self.qh_from_qs = QH_OFFSET - QS_OFFSET  # (lm addresses the qs bytes)

    def tile(self, st, mt_off):
        b = self.b
        h = b.regs("b32", 4)
        off = mt_off + self.qh_from_qs  # (a negative offset as a register: PTX's addresses take + imm only)
        at = b.op("add.u32", st, self.lm)
        addr = Mem(at, off) if off >= 0 else Mem(b.op("sub.u32", at, Imm(-off, "u32")))
        b.emit(ldmatrix(self.arch, 4, b.vec(h), addr))
        return h

    def _bit4(self, h, j):
        """Bit j of each byte of h at bit 4 (the other bits zero)."""
        b = self.b
        sh = b.op("shl.b32", h, Imm(4 - j, "u32")) if j < 4 else b.op("shr.u32", h, Imm(j - 4, "u32")) if j > 4 else h
        return b.op("and.b32", sh, Imm(0x10101010, "b32"))

    def group(self, a, q, h):
        b = self.b
        lo, hi = [], []
        for r, hr in zip(a, h):
            for out, src, j in ((lo, r, 2 * q), (hi, b.op("shr.u32", r, Imm(4, "u32")), 2 * q + 1)):
                v = b.reg("b32")
                b.emit("lop3.b32", v, src, Imm(0x0F0F0F0F, "b32"), self._bit4(hr, j), Imm(0xEA, "b32"))  # (src & c) | bit
                out.append(v)
        return lo, hi


WIDE_BLOCKS = 2  # dequant_lane_wide: a warp step covers 2 blocks, 16 weights a lane


def dequant_lane_wide(b, w, group, lane, count, f32: bool = True):
    """The GEMVs' wider step: _common.kquant_lane_wide (16 weights a lane, factored runs)."""
    return kquant_lane_wide(b, w, group, lane, count, fmt=FMT, block_bytes=BLOCK_BYTES, qs_offset=QS_OFFSET, qh_offset=QH_OFFSET)

def run8(b, row, k0):
    """Weights k0 .. k0 + 7 of the row at `row` (k0 a multiple of 8): float32 exactly as ggml (Q4_K's decode plus the
    fifth bits: bit 2c + hi of qh bytes k0 % 32 ..)."""
    kin, c, hi, env = q4_k.run8_head(b, row, k0, FMT, BLOCK_BYTES)
    block = env["block"]
    l = b.op("and.b32", kin, Imm(31, "b32"))
    qs, qh = b.regs("b32", 2), b.regs("b32", 2)
    b.emit("ld.global.nc.v2.u32", b.vec(qs), Mem(b.op("add.s64", block, b.op("cvt.u64.u32", b.op(
        "add.u32", b.op("shl.b32", c, Imm(5, "u32")), l))), QS_OFFSET))
    b.emit("ld.global.nc.v2.u32", b.vec(qh), Mem(b.op("add.s64", block, b.op("cvt.u64.u32", l)), QH_OFFSET))
    shift, bit = b.op("shl.b32", hi, Imm(2, "u32")), env["sub"]
    env["q"] = [b.op("or.b32", b.op("bfe.u32", qs[j // 4], b.op("add.u32", shift, Imm(8 * (j % 4), "u32")), Imm(4, "u32")),
                     b.op("shl.b32", b.op("bfe.u32", qh[j // 4], b.op("add.u32", bit, Imm(8 * (j % 4), "u32")),
                                          Imm(1, "u32")), Imm(4, "u32")))
                for j in range(8)]
    ApplyScaleMin("q", "d1", "m1", "w").lower(b, env)
    return env["w"]


def run32(b, row, k0):
    """Weights k0 .. k0 + 31 (k0 a multiple of 32: one sub-block) — run8's values, bit for bit, with the header and
    its (scale, min) decoded once instead of four times (the MoE GEMM's A tile: 32 weights a thread a step)."""
    kin, c, hi, env = q4_k.run8_head(b, row, k0, FMT, BLOCK_BYTES)
    block = env["block"]
    qs, qh = b.regs("b32", 8), b.regs("b32", 8)
    at = b.op("add.s64", block, b.op("cvt.u64.u32", b.op("shl.b32", c, Imm(5, "u32"))))
    for i in range(4):  # 8-byte loads: run8's alignment (weights_error)
        b.emit("ld.global.nc.v2.u32", b.vec(qs[2 * i:2 * i + 2]), Mem(at, QS_OFFSET + 8 * i))
        b.emit("ld.global.nc.v2.u32", b.vec(qh[2 * i:2 * i + 2]), Mem(block, QH_OFFSET + 8 * i))
    shift, bit = b.op("shl.b32", hi, Imm(2, "u32")), env["sub"]
    # per word, 4 weights at once: the nibble (shifted down by 4·hi) and the fifth bit (bit `sub` of each qh byte)
    # into one byte each; then constant byte extracts (variable-position bfe costs ptxas 3 instructions a weight)
    words = [b.op("or.b32", b.op("and.b32", b.op("shr.u32", qs[i], shift), Imm(0x0F0F0F0F, "b32")),
                  b.op("shl.b32", b.op("and.b32", b.op("shr.u32", qh[i], bit), Imm(0x01010101, "b32")), Imm(4, "u32")))
             for i in range(8)]
    env["q"] = [b.op("bfe.u32", words[j // 4], Imm(8 * (j % 4), "u32"), Imm(8, "u32")) for j in range(32)]
    ApplyScaleMin("q", "d1", "m1", "w").lower(b, env)
    return env["w"]


class GgmlLane(q4_k.GgmlLane):
    """Q5_K in kernels/gemv.py's MMVQ-style lane GEMV (build_lanes_ggml: gemv_q5_k_fast_t*, int8 x Q8_1 with dp4a,
    as llama.cpp's vec_dot_q5_K_q8_1): Q4_K's lane (a pair of sub-blocks 2j, 2j + 1: the 32 qs bytes they share,
    the header, the Q8_1 blocks 2P, 2P + 1), plus the 32 qh bytes, whose bits 2j and 2j + 1 become the fifth bit of
    the low and high nibbles. y += d·sc·d_a·Σq·q_a − dmin·m·d_a·Σq_a per sub-block, q = 0..31."""
    WORDS = 20  # the header (4), qh (8), the pair's qs (8)
    MIN_CTAS = q4_k.WIDE_LANE_MIN_CTAS
    EXACT = False  # int8 x Q8_1 only (its exact decode is the codec GEMVs' and the few-token builds')
    BLOCK_BYTES = BLOCK_BYTES

    def load(self, b, u, rowptr, regs, pred):
        """Unit u of a row: the header (16 B), qh (32 B), then the pair's 32 qs bytes at 48 + 32·(u % 4)."""
        sb = b.op("add.s64", rowptr, b.op("mul.wide.u32", b.op("shr.u32", u, Imm(2, "u32")), Imm(BLOCK_BYTES, "u32")))
        qp = b.op("add.s64", sb, b.op("cvt.u64.u32", b.op("shl.b32", b.op("and.b32", u, Imm(3, "b32")), Imm(5, "u32"))))
        b.emit("ld.global.nc.v4.u32", b.vec(regs[0:4]), Mem(sb), pred=pred)
        b.emit("ld.global.nc.v4.u32", b.vec(regs[4:8]), Mem(sb, QH_OFFSET), pred=pred)
        b.emit("ld.global.nc.v4.u32", b.vec(regs[8:12]), Mem(sb, QH_OFFSET + 16), pred=pred)
        b.emit("ld.global.nc.v4.u32", b.vec(regs[12:16]), Mem(qp, QS_OFFSET), pred=pred)
        b.emit("ld.global.nc.v4.u32", b.vec(regs[16:20]), Mem(qp, QS_OFFSET + 16), pred=pred)

    def quants(self, b, regs, h):
        """The 8 words of four q = 0..31 each of sub-block 2j + h: the nibble, and bit 2j + h of qh[l] as bit 4."""
        sub = self.sub_hi if h else self.sub_lo
        return [b.op("or.b32", b.op("and.b32", q if h == 0 else b.op("shr.u32", q, Imm(4, "u32")), Imm(0x0F0F0F0F, "b32")),
                     b.op("and.b32", b.op("shl.b32", b.op("shr.u32", hw, sub), Imm(4, "u32")), Imm(0x10101010, "b32")))
                for q, hw in zip(regs[12:20], regs[4:12])]
