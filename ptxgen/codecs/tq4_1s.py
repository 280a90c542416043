"""The TQ4_1S weight codec (TurboQuant's 4-bit format, ptxgen/formats/tq4_1s.py): 20 bytes per 32 weights — d0, d1
(fp16: elements 0-15, 16-31), 16 bytes of codebook indices (element j: the low nibble of byte j / 2 when j is even)
— whose values C[idx]·d are the weights in the rotated domain: y = Σ_b <C[idx]·d, forward_rht(x_b)>, so every
kernel over it multiplies a rotated activation (ROTATION). Its lane and tensor-core decode GEMVs keep their own decodes
(kernels/gemv.py), the fused-rotation unit GEMV reads `UnitLane`; `run8` / `dequant_lane` give the prepared
prefill (fragments, fixup) the same fp32 values."""
from __future__ import annotations

import numpy as np

from ..formats.tq4_1s import CODEBOOK
from ..ir import Imm, Mem
from ._common import alignment_error, block_lanes, geometry

FMT = "tq4_1s"
BLOCK_K, BLOCK_BYTES = geometry(FMT)  # 32, 20
GROUP_BLOCKS = 8  # a warp step: 8 blocks (256 weights), lane L the 8 elements 8·(L % 4) .. of block L / 4
LOAD_ALIGN = 4
ROTATION = "rotate_tq4_1s"  # the kernel that rotates the activation (forward_rht(x)), once, on the prefill route
ROUTES = {"exact": ("mmq_ra", "mmq_pre", "mmq_f16", "decode"), "fast": ("fast_lanes",)}  # mul_mat's routes (runtime/ops.py)
# the exact decode route's choices (runtime/ops.py _decode, as Q4_K's DECODE): the tensor-core GEMV only where the
# TMA-fed GEMVs may run (its weights come by TMA), from 3 tokens at mma_gemv_t3_min_weights weights, else from
# mma_gemv_min_tokens; the lane GEMVs TMA-fed (gemv_tq4_1s_tma_t*) where they may be; no few-token builds
DECODE = {"mma_knob": "tq4_mma", "mma_min": ("mma_gemv_t3_min_weights", 3, "mma_gemv_min_tokens"),
          "mma_needs_tma": True, "lane_tma": True}


weights_error = alignment_error(FMT, LOAD_ALIGN)  # every kernel reads the blocks in 4-byte words


def _codebook(b):
    """The 16 codebook values as a global table of this kernel (declared once per kernel)."""
    if not any(c.name == "tq4_codebook" for c in b.consts):
        b.const_table("tq4_codebook", np.asarray(CODEBOOK, np.float32).tobytes())
    from ..ir import Sym

    return b.op("mov.u64", Sym("tq4_codebook"))


def run8(b, row, k0):
    """Weights k0 .. k0 + 7 of the row at `row` (k0 a multiple of 8), rotated domain: C[idx]·d in float32 (as
    formats.tq4_1s.rotated_values)."""
    block = b.op("mad.wide.u32", b.op("shr.u32", k0, Imm(5, "u32")), Imm(BLOCK_BYTES, "u32"), row)
    j0 = b.op("and.b32", k0, Imm(31, "b32"))
    hw = b.op("ld.global.nc.u32", Mem(block))  # d0 | d1
    dbits = b.op("cvt.u16.u32", b.op("shr.u32", hw, b.op("and.b32", j0, Imm(16, "b32"))), type="b16")
    d = b.op("cvt.f32.f16", dbits)
    qw = b.op("ld.global.nc.u32", Mem(b.op("add.s64", block, b.op("cvt.u64.u32", b.op("shr.u32", j0, Imm(1, "u32")))), 4))
    tab = _codebook(b)
    out = []
    for j in range(8):  # element j0 + j: byte j / 2 of the word, low nibble for even j
        idx = b.op("bfe.u32", qw, Imm(4 * j, "u32"), Imm(4, "u32"))
        c = b.op("ld.global.nc.f32", Mem(b.op("mad.wide.u32", idx, Imm(4, "u32"), tab)))
        out.append(b.op("mul.rn.f32", c, d))
    return out


def dequant_lane(b, w, group, lane, count, f32: bool = False):
    """A warp's step over 256 weights (as q4_k.dequant_lane): lane L takes block 8·group + L / 4 (valid below
    `count` blocks), its elements 8·(L % 4) .. + 7, rotated domain, float32 only (TQ4_1S's dequantize to the
    real domain is the CPU's: formats.dequantize)."""
    if not f32:
        raise ValueError("tq4_1s: dequant_lane gives the rotated-domain fp32 weights only")
    blk, valid, offsets = block_lanes(b, group, lane, count, GROUP_BLOCKS)
    # a lane past the row reads its last block (count None: the caller knows the group is whole)
    inrow = blk if count is None else b.op("min.u32", blk, b.op("sub.u32", count, Imm(1, "u32")))
    k0 = b.op("mad.lo.u32", inrow, Imm(BLOCK_K, "u32"), b.op("shl.b32", b.op("and.b32", lane, Imm(3, "b32")), Imm(3, "u32")))
    vals = run8(b, w, k0)  # (those lanes' values are multiplied by predicated-off zeros)
    return [vals], offsets, valid


# The register-A wgmma MMQ (kernels/mmq.py, mmq_tq4_1s_wgmma_ra_n*): a K-step is 64 weights, two blocks, 40 bytes at
# 40·s of a row (rows a 16-byte multiple: K a multiple of 128). A TMA box starts 16-byte aligned, so step s's box
# starts at 40·s − 8·(s & 1) and its blocks sit 8·(s & 1) bytes in; 48-byte rows put rows g = 0..7 in distinct bank
# groups. The codebook is symmetric (C[15 − i] = −C[i]): its 8 magnitudes as fp16 pairs in 4 registers, two prmts
# look a pair up, a third picks by the magnitude's bit 2, the sign goes into d.
RA_BOX_BYTES = 48
RA_BOX_NOTE = "K-step s's box from 40·s − 8·(s & 1): its two blocks from byte 8·(s & 1)"
_MAGS = np.asarray(CODEBOOK[8:], np.float16).view(np.uint16).astype(np.uint32)  # C[8 + j] = −C[7 − j], j = 0..7


def ra_box_column(b, s):
    """K-step s's TMA box start in the row, bytes: 40·s rounded down to a multiple of 16."""
    return b.op("sub.u32", b.op("mul.lo.u32", s, Imm(40, "u32")),
                b.op("shl.b32", b.op("and.b32", s, Imm(1, "b32")), Imm(3, "u32")))


def ra_fragments(b, rbase, row_offs, s, t):
    """One K-step's register-A fragments from its TMA box (rows of RA_BOX_BYTES at rbase + row_offs[rr]), in Q8_0's
    positions (q8_0.ra_fragments: lane (g, t) takes elements 8t .. 8t + 7 of both blocks of rows g and g + 8, the
    A pair (e, e + 2), e = 8t + 4·wi + sh, for the activation's layouts.q4k_rega_k_order): the lane's 8 indices are
    one word (qs bytes 4t .. 4t + 3; element 2m the low nibble of byte m), its scale d0 (t < 2) or d1. Per nibble
    the magnitude index (i − 8, or 7 − i below 8: the nibble xor 7 where its bit 3 is clear), then a pair (e, e + 2)
    — the same nibble half of bytes 2·wi and 2·wi + 1 — is looked up as fp16 magnitudes (prmt in (m0..m3) and in
    (m4..m7) by the low two bits, a prmt between them by bit 2) and multiplied by (±d, ±d), the sign from bit 3:
    fp16(fp16(C)·d), within an fp16 rounding of the prepared route's fp16(C·d). Returns the 4 k16 slices' A
    registers."""
    o = b.op("shl.b32", b.op("and.b32", s, Imm(1, "b32")), Imm(3, "u32"))  # the step's first block in the box
    qoff = b.op("shl.b32", t, Imm(2, "u32"))  # the lane's word of a block's qs
    doff = b.op("shl.b32", b.op("shr.u32", t, Imm(1, "u32")), Imm(1, "u32"))  # d0 (t < 2) or d1
    mags = [b.op("mov.b32", Imm(int(_MAGS[2 * j]) | int(_MAGS[2 * j + 1]) << 16, "b32")) for j in range(4)]
    frag = {}
    for rr, roff in enumerate(row_offs):
        base = b.op("add.u32", b.op("add.u32", rbase, roff), o)  # 4-byte aligned: the first block's d0
        for sb in range(2):
            w = b.op("ld.shared.u32", Mem(b.op("add.u32", base, qoff), 20 * sb + 4))
            dh = b.reg("b16")
            b.emit("ld.shared.b16", dh, Mem(b.op("add.u32", base, doff), 20 * sb))
            dd = b.op("mov.b32", b.vec([dh, dh]), type="b32")
            neg = b.reg("b32")  # 1 in each nibble whose bit 3 is clear (a negative codebook entry)
            b.emit("lop3.b32", neg, b.op("shr.u32", w, Imm(3, "u32")), Imm(0x11111111, "b32"), Imm(0, "b32"),
                   Imm(0x0C, "b32"))  # ~a & b
            mag = b.op("xor.b32", w, b.op("mul.lo.u32", neg, Imm(7, "u32")))  # per nibble: bit 3, magnitude index
            for sh in range(2):
                hm = mag if sh == 0 else b.op("shr.u32", mag, Imm(4, "u32"))  # nibble half sh of each byte, bits 0-3
                # per byte (element of the pair): the prmt selector of its half — bytes 2k, 2k + 1, k = index & 3 —
                # and of the pick between the two lookups (v1 where the index's bit 2 is set); prmt reads bits 0-15
                sels = b.op("mad.lo.u32", b.op("and.b32", hm, Imm(0x03030303, "b32")), Imm(0x22, "u32"),
                            Imm(0x10101010, "u32"))
                picks = b.op("mad.lo.u32", b.op("and.b32", hm, Imm(0x04040404, "b32")), Imm(0x11, "u32"),
                             Imm(0x32103210, "u32"))
                for wi in range(2):
                    x = hm if wi == 0 else b.op("shr.u32", hm, Imm(16, "u32"))
                    sel = sels if wi == 0 else b.op("shr.u32", sels, Imm(16, "u32"))
                    v0 = b.op("prmt.b32", mags[0], mags[1], sel)
                    v1 = b.op("prmt.b32", mags[2], mags[3], sel)
                    v = b.op("prmt.b32", v0, v1, picks if wi == 0 else b.op("shr.u32", picks, Imm(16, "u32")))
                    sg = b.reg("b32")  # bits 3 and 11 clear → the halves' sign bits 15 and 31 (bit 23 junk)
                    b.emit("lop3.b32", sg, x, Imm(0x0808, "b32"), Imm(0, "b32"), Imm(0x0C, "b32"))  # ~a & b
                    sg2 = b.op("mul.lo.u32", sg, Imm(0x00101000, "u32"))
                    ds = b.reg("b32")
                    b.emit("lop3.b32", ds, dd, sg2, Imm(0x80008000, "b32"), Imm(0x78, "b32"))  # a ^ (b & c)
                    frag[rr, 4 * sb + 2 * wi + sh] = b.op("mul.rn.f16x2", v, ds, type="b32")
    return [[frag[0, 2 * kk], frag[1, 2 * kk], frag[0, 2 * kk + 1], frag[1, 2 * kk + 1]] for kk in range(4)]


class UnitLane:
    """TQ4_1S in kernels/gemv.py's 8-weight-unit GEMV (gemv_tq4_1s_t{1,2,4}_fused): lane L of a warp step's 256
    columns takes word L % 4 (elements 8·(L % 4) .. + 7) of block L / 4 — the codebook values (the table), one
    fp16 scale (d0 for words 0-1, d1 for 2-3), no min term."""
    LUT = tuple(float(v) for v in CODEBOOK)
    ACT_SECOND = 16
    MIN_TERM = False

    @staticmethod
    def row_bytes(b, K):
        return b.op("mul.lo.u32", b.op("shr.u32", K, Imm(5, "u32")), Imm(BLOCK_BYTES, "u32"))

    def __init__(self, b, lane, K):
        self.word = b.op("and.b32", lane, Imm(3, "b32"))
        self.blk_in_chunk = b.op("shr.u32", lane, Imm(2, "u32"))
        # scale half: words 0,1 (elements 0..15) use d0, words 2,3 use d1
        self.dshift = b.op("shl.b32", b.op("shr.u32", self.word, Imm(1, "u32")), Imm(4, "u32"))
        self.col_in_chunk = b.op("mad.lo.u32", self.blk_in_chunk, Imm(32, "u32"),
                                 b.op("shl.b32", self.word, Imm(3, "u32")))
        self.nunits = b.op("shr.u32", K, Imm(3, "u32"))  # total 8-weight units in a row

    @staticmethod
    def regs(b):
        """A row's load registers: (the qs word, [the block's scale word])."""
        return b.reg("b32"), [b.reg("b32")]

    def load(self, b, c, rowptr, regs, live):
        """Chunk c's loads of one row (index 8 = value 0 and scale 0 where the lane is past the row)."""
        qw, extra = regs
        blkp = b.op("mad.wide.u32", b.op("mad.lo.u32", c, Imm(8, "u32"), self.blk_in_chunk), Imm(BLOCK_BYTES, "u32"),
                    rowptr)
        b.emit("mov.b32", qw, Imm(0x88888888, "b32"))
        b.emit("mov.b32", extra[0], Imm(0, "b32"))
        b.emit("ld.global.nc.u32", qw, Mem(b.op("mad.wide.u32", self.word, Imm(4, "u32"), blkp), 4), pred=live)
        b.emit("ld.global.nc.u32", extra[0], Mem(blkp), pred=live)

    @staticmethod
    def element(e):
        """Unit element e: byte e / 2, its low nibble when e is even."""
        return ("lo" if e % 2 == 0 else "hi"), e // 2

    def groups(self, b, regs):
        half = b.op("cvt.u16.u32", b.op("shr.u32", regs[1][0], self.dshift))
        return [(range(8), b.op("cvt.f32.f16", half), None)]
