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


def ra_box_column(b, s):
    """K-step s's TMA box start in the row, bytes: 68·s rounded down to a multiple of 16."""
    return b.op("add.u32", b.op("shl.b32", s, Imm(6, "u32")), b.op("shl.b32", b.op("shr.u32", s, Imm(2, "u32")),
                                                                   Imm(4, "u32")))


def ra_step_offset(b, s):
    """With a box a block: where K-step s's own box start (ra_fragments' rbase) sits in it, bytes: 64·(s & 3)."""
    return b.op("shl.b32", b.op("and.b32", s, Imm(3, "b32")), Imm(6, "u32"))


def ra_fragments(b, rbase, row_offs, s, t, natural: bool = False):
    """One K-step's register-A fragments from its TMA box (rows at rbase + row_offs[rr], the build's pitch: a step's
    RA_BOX_BYTES or a block's RA_BLOCK_BOX_BYTES, rbase then at the step's ra_step_offset in it): lane
    (g, t) takes quants 8t .. 8t + 7 of both blocks of its rows g and g + 8 — the positions q4_k's register-A
    decode gives its nibbles (block sb in the place of sub-block 2c + sb, element e in the place of qs byte e), so
    the activation keeps layouts.q4k_rega_k_order. A pair of quants (e, e + 2) becomes (1152 + q) halves by one
    prmt against 0x64 (after the sign bit is flipped), then (h − 1152)·d: q exact, then one rounding, fp16(q·d) —
    ggml's float32 q·d rounded once, as the prepared fragments hold it. Returns the 4 k16 slices' A registers.
    `natural` (x in its own K order, kernels/mmq.py RA_NATURAL_FORMATS): quants 2t, 2t + 1 of each 8 of a block
    instead — as q4_k.RegA's natural words (two 2-byte loads and a prmt a word), the decode after them the same."""
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
