"""The TQ4_1S weight codec (TurboQuant's 4-bit format, ptxgen/formats/tq4_1s.py): 20 bytes per 32 weights — d0, d1
(fp16: elements 0-15, 16-31), 16 bytes of codebook indices (element j: the low nibble of byte j / 2 when j is even)
— whose values C[idx]·d are the weights in the rotated domain: y = Σ_b <C[idx]·d, forward_rht(x_b)>, so every
kernel over it multiplies a rotated activation (ROTATION).

The decodes, by the kernels that consume them:
- `run8` / `dequant_lane`: fp32 values for the prepared prefill (fragments, fixup);
- `ra_box_column` / `ra_fragments`: the register-A wgmma MMQ's A fragments from its TMA box;
- `UnitLane`: the fused-rotation 8-weight-unit GEMV's lane (kernels/gemv.py build);
- the lane-per-block decode GEMVs (kernels/gemv.py build_lanes, build_tma_lanes): a block's loads (`load_block`,
  `blocks_bytes`, `box_column`), its scales (`scales`), the codebook by nibble from a 16-entry shared table
  (`lut_fill`, `lut_nibbles`, `lut_value`) or by qs byte from a pair table (`fill_pair_table`, `pair_lookup`), and the
  fast GEMV's int8 codebook (`FastCodebook`);
- `MmaGemvDecoder` (with `mma_table_fill`): the tensor-core decode GEMV's (gemv_tq4_1s_mma) hi / lo A fragments and
  row scales on its TMA ring."""
from __future__ import annotations

import numpy as np

from ..formats.tq4_1s import CODEBOOK, CODEBOOK_S8, mma_element_table, mma_pair_table
from ..ir import Imm, Mem, Reg
from ._common import UnitScaleBlock, alignment_error, block_lanes, geometry

FMT = "tq4_1s"
BLOCK_K, BLOCK_BYTES = geometry(FMT)  # 32, 20
GROUP_BLOCKS = 8  # a warp step: 8 blocks (256 weights), lane L the 8 elements 8·(L % 4) .. of block L / 4
LOAD_ALIGN = 4
ROTATION = "rotate_tq4_1s"  # the kernel that rotates the activation (forward_rht(x)), once, on the prefill route
EXACT_ROUTES = ("mmq_ra", "mmq_pre", "mmq_f16", "codec_few", "decode")
ROUTES = {"exact": EXACT_ROUTES, "fast": ("fast_lanes",) + EXACT_ROUTES}  # mul_mat's routes (runtime/ops.py)
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


# --- the decode GEMVs of kernels/gemv.py: lane per block (build_lanes, build_tma_lanes: lane l takes block jb + l of
# each row, loaded whole) and on tensor cores (build_mma_gemv) ---------------------------------------------------------
BLOCK_WORDS = BLOCK_BYTES // 4  # 5: the scale word (d0 | d1), then qs words 0-3 (elements 8w .. 8w + 7)
STEP_BLOCKS = 32  # a lane GEMV's step: one block a lane
STEP_ROW_BYTES = STEP_BLOCKS * BLOCK_BYTES  # 640: a row's bytes of one step (the TMA lane GEMV's box row)
LUT_BYTES = 256  # the 16-entry fp32 codebook, 256-aligned: prmt drops nibble·4 into its address's low byte


def blocks_bytes(b, n):
    """n blocks in bytes (a row of n blocks, or block n's offset in a row)."""
    return b.op("mul.lo.u32", n, Imm(BLOCK_BYTES, "u32"))


def box_column(b, jb):
    """Block jb's column in a row of u32 (a TMA box's start: the tensor maps' element is a u32)."""
    return b.op("mul.lo.u32", jb, Imm(BLOCK_WORDS, "u32"))


def block_regs(b):
    """The BLOCK_WORDS registers a lane's block is loaded into."""
    return b.regs("b32", BLOCK_WORDS)


def load_block(b, words, addr, offset=0, shared: bool = False, pred=None, zero: bool = False):
    """A block's words from one address at immediate offsets (4-byte aligned: 20-byte blocks); `zero`: each register
    cleared before its (predicated) load, so a lane past the row holds scale 0."""
    for i, w in enumerate(words):
        if zero:
            b.emit("mov.b32", w, Imm(0, "b32"))
        b.emit("ld.shared.u32" if shared else "ld.global.nc.u32", w, Mem(addr, offset + 4 * i), pred=pred)


def scales(b, sw):
    """A block's two scales, d0 (elements 0-15) and d1 (16-31), in fp32 from its scale word (d0 | d1)."""
    return [b.op("cvt.f32.f16", b.op("cvt.u16.u32", sw)),
            b.op("cvt.f32.f16", b.op("cvt.u16.u32", b.op("shr.u32", sw, Imm(16, "u32"))))]


def block_scales(b, words):
    """scales() of a lane's block words (load_block's)."""
    return scales(b, words[0])


def qs_word(words, wi):
    """qs word wi (elements 8·wi .. 8·wi + 7) of a lane's block words."""
    return words[1 + wi]


def lut_fill(b, tid, lut):
    """Threads 0-15 copy the codebook (fp32) into the LUT_BYTES shared table `lut` — its symbol (the address is
    taken here, after the global load) or its address; returns the address. The caller's barrier publishes it."""
    table = b.const_table("lut_init", CODEBOOK.tobytes())
    small = b.op("setp.lt.u32", tid, Imm(16, "u32"))
    tv = b.reg("f32")
    b.emit("ld.global.nc.f32", tv, Mem(b.op("mad.wide.u32", tid, Imm(4, "u32"), b.op("mov.u64", table))), pred=small)
    if not isinstance(lut, Reg):
        lut = b.op("mov.u32", lut)
    b.emit("st.shared.f32", Mem(b.op("mad.lo.u32", tid, Imm(4, "u32"), lut)), tv, pred=small)
    return lut


def lut_nibbles(b, qw):
    """A qs word's low and high nibbles, each ·4 in its byte: lut_value's table offsets."""
    return (b.op("and.b32", b.op("shl.b32", qw, Imm(2, "u32")), Imm(0x3C3C3C3C, "b32")),
            b.op("and.b32", b.op("shr.u32", qw, Imm(2, "u32")), Imm(0x3C3C3C3C, "b32")))


def lut_value(b, lo4, hi4, lut, e):
    """Element e of a qs word (byte e / 2, the low nibble when e is even) from lut_nibbles: C[idx] from the
    256-aligned table, the nibble·4 put into the address's low byte by one prmt (16 distinct words: no bank
    conflicts)."""
    addr = b.op("prmt.b32", lo4 if e % 2 == 0 else hi4, lut, Imm(0x7650 | (e // 2), "b32"))
    return b.op("ld.shared.f32", Mem(addr))


# The pair tables: per qs byte v both its elements' codebook values in one 8-byte entry, `copies` copies of the 256
# entries (entry (v, copy c) at v·(8·copies) + 8·c; lane l reads copy l % copies: 32 copies one a lane, 16 lanes l
# and l + 16 share one, a 64-bit access being served per half-warp), so one LDS.64 looks a byte up.
def pair_table_bytes(copies):
    """Bytes of a pair table of `copies` copies."""
    return 256 * copies * 8


def fill_pair_table(b, table, tid, lane, copies, nthreads):
    """The lane GEMV's pair table at `table`: entry (v, c) holds (C[v & 15], C[v >> 4]) in fp32. Thread (row r =
    tid / copies, copy c = tid % copies) writes v = r + rows·i, rows = nthreads / copies (8 or 16): C[v >> 4] =
    C[rows·i >> 4] is an immediate, C[v & 15] one of two (or one) loaded values (a copy of 256 loaded pairs, as
    copy_pair_table, measured 24.8 vs 23.6-24.0 µs at T=1 on 18944x3584 in one run — within this shape's spread, but
    the version with more runs was kept)."""
    rows = nthreads // copies
    assert rows in (8, 16), (copies, nthreads)
    r = b.op("shr.u32", tid, Imm(copies.bit_length() - 1, "u32"))
    cb = b.op("mov.u64", b.const_table("codebook", CODEBOOK.tobytes()))
    lo = {}
    for i in range(256 // rows):
        o = rows * i & 15
        if o not in lo:
            at = b.op("mad.wide.u32", b.op("add.u32", r, Imm(o, "u32")), Imm(4, "u32"), cb)
            lo[o] = b.op("ld.global.nc.f32", Mem(at))
    c8 = b.op("shl.b32", b.op("and.b32", lane, Imm(copies - 1, "b32")), Imm(3, "u32"))
    dst = b.op("add.u32", b.op("mad.lo.u32", r, Imm(8 * copies, "u32"), table), c8)
    for i in range(256 // rows):
        hi = b.op("mov.f32", Imm(float(CODEBOOK[rows * i >> 4]), "f32"))
        b.emit("st.shared.v2.f32", Mem(dst, 8 * copies * rows * i), b.vec([lo[rows * i & 15], hi]))


def copy_pair_table(b, tbl, tid, lane, copies, nthreads, table_bytes):
    """Replicate a 256-entry table of 8-byte pairs (`table_bytes`, global) into shared memory at `tbl`. Thread (r =
    tid / copies, c = tid % copies) copies v = r + rows·i, rows = nthreads / copies."""
    rows = nthreads // copies
    r = b.op("shr.u32", tid, Imm(copies.bit_length() - 1, "u32"))
    src = b.op("mad.wide.u32", r, Imm(8, "u32"), b.op("mov.u64", b.const_table("pair_init", table_bytes, align=16)))
    dst = b.op("add.u32", b.op("mad.lo.u32", r, Imm(8 * copies, "u32"), tbl),
               b.op("shl.b32", b.op("and.b32", lane, Imm(copies - 1, "b32")), Imm(3, "u32")))
    for i in range(256 // rows):
        v = b.regs("b32", 2)
        b.emit("ld.global.nc.v2.u32", b.vec(v), Mem(src, 8 * rows * i))
        b.emit("st.shared.v2.u32", Mem(dst, 8 * copies * rows * i), b.vec(v))


def pair_lane_term(b, lane, copies):
    """The lane's part of a pair-table offset as pair_offset wants it: (lane % copies) << 3 for 32 copies, << 4 for
    16 (prmt drops the byte into bits 8-15 beside it; the sum is halved)."""
    return b.op("shl.b32", b.op("and.b32", lane, Imm(copies - 1, "b32")), Imm(3 if copies == 32 else 4, "u32"))


def pair_offset(b, w, j, lanec, copies):
    """Byte j of `w` as an offset into a pair table: v·(8·copies) + 8·(lane % copies). prmt puts v in bits 8-15
    beside lanec = (lane % copies) << 3 (32 copies) or << 4 (16 copies: the sum is halved)."""
    off = b.op("prmt.b32", w, lanec, Imm(0x5504 | (j << 4), "b32"))  # (v << 8) | lanec
    return off if copies == 32 else b.op("shr.u32", off, Imm(1, "u32"))


def pair_lookup(b, w, j, lanec, copies, table, t: str = "f32"):
    """Byte j of `w`'s entry of the pair table at `table`: its two words (type `t`) by one ld.shared.v2."""
    vals = b.regs(t, 2)
    b.emit(f"ld.shared.v2.{t}", b.vec(vals), Mem(b.op("add.u32", pair_offset(b, w, j, lanec, copies), table)))
    return vals


class FastCodebook:
    """The fast lane GEMV's int8 codebook (CODEBOOK_S8, the TurboQuant fork's dp4a path: round(C·127/2.733), the
    sum rescaled by FAST_RESCALE) in four ordinary registers, and the two prmt selectors that replicate a nibble's
    sign bit. The constructor emits the table's load: at an address ptxas cannot prove uniform (%tid.y is 0 in a 1-D
    block): as immediates it keeps them in uniform registers and copies them into a register before every prmt."""

    def __init__(self, b):
        self.b = b
        tab = b.const_table("cb_s8", CODEBOOK_S8.tobytes(), align=16)
        self.tl0, self.tl1, self.th0, self.th1 = b.regs("b32", 4)
        b.emit("ld.global.nc.v4.u32", b.vec([self.tl0, self.tl1, self.th0, self.th1]),
               Mem(b.op("mad.wide.u32", b.special("tid.y"), Imm(16, "u32"), b.op("mov.u64", tab))))
        self.sel_lo = b.op("mov.b32", Imm(0xD9C8, "b32"))  # sign-replicating selectors: bit 3 of a nibble → 0x00/0xFF
        self.sel_hi = b.op("mov.b32", Imm(0xFBEA, "b32"))

    def values(self, qw):
        """A qs word's 8 weights as int8 (dp4a operands), elements 0-3 and 4-7 of the word in byte order: per
        nibble its low 3 bits look up both halves of the table by prmt, its bit 3 (sign-replicated by a prmt of the
        word and the word << 4) picks one (lop3)."""
        b = self.b
        t4 = b.op("shl.b32", qw, Imm(4, "u32"))
        w8 = []
        for src, sel in ((qw, self.sel_lo), (b.op("shr.u32", qw, Imm(16, "u32")), self.sel_hi)):
            idx = b.op("and.b32", src, Imm(0x7777, "b32"))
            lo = b.op("prmt.b32", self.tl0, self.tl1, idx)
            hi = b.op("prmt.b32", self.th0, self.th1, idx)
            pick = b.op("prmt.b32", t4, qw, sel)
            v8 = b.reg("b32")
            b.emit("lop3.b32", v8, lo, hi, pick, Imm(0xD8, "b32"))
            w8.append(v8)
        return w8


# The tensor-core decode GEMV (build_mma_gemv: gemv_tq4_1s_mma, _m16): A = the codebook values split into fp16 hi + lo,
# either one LDS.64 per qs byte from a pair table of mma_pair_table's (hi, hi) and (lo, lo) words (`copies` copies),
# or one 4-byte lookup per element from the 2 KB per-element table (mma_element_table: (hi, lo) per index, one copy a
# lane) and two prmt per byte.
MMA_ELEMENT_TABLE_BYTES = 2048


def mma_table_bytes(copies):
    """Shared bytes of the tensor-core GEMV's codebook: the pair table (`copies`) or the per-element table (None)."""
    return pair_table_bytes(copies) if copies else MMA_ELEMENT_TABLE_BYTES


def mma_table_fill(b, tbl, tid, lane, copies, nthreads):
    """The tensor-core GEMV's codebook into shared memory at `tbl` (`nthreads` threads; the caller's barrier
    publishes it). Returns the lane's pair-table term (pair_lane_term), None for the per-element table."""
    if copies:
        b.comment(f"the pair table (A words (hi, lo) of both elements per qs byte, {copies} copies); one CTA barrier "
                  "for it and the stage barriers")
        copy_pair_table(b, tbl, tid, lane, copies, nthreads, mma_pair_table().tobytes())
        return pair_lane_term(b, lane, copies)
    b.comment("the 2 KB codebook table ((hi, lo) fp16 per index, one copy per lane); one CTA barrier for it and the "
              "stage barriers")
    pt = b.op("mov.u64", b.const_table("codebook_init", mma_element_table().tobytes(), align=16))
    v4 = b.regs("b32", 4)
    first = b.op("setp.lt.u32", tid, Imm(128, "u32")) if nthreads > 128 else None  # threads 0-127: 16 bytes each
    b.emit("ld.global.nc.v4.u32", b.vec(v4), Mem(b.op("mad.wide.u32", tid, Imm(16, "u32"), pt)), pred=first)
    b.emit("st.shared.v4.u32", Mem(b.op("mad.lo.u32", tid, Imm(16, "u32"), tbl)), b.vec(v4), pred=first)
    return None


class MmaGemvDecoder:
    """TQ4_1S for the tensor-core GEMV (kernels/gemv.py build_mma_gemv): lane (g, t) decodes rows 16·mt + g and + 8
    of each m16 tile of a ring stage (rows of `row_stride` bytes, blocks BLOCK_BYTES apart) into mma.sync m16n8k16
    A fragments, hi and lo fp16 of C[idx] (the scales d0, d1 are applied to the fp32 C fragments). K order: for
    half block h the lane reads qs word 2h + t/2 and uses its bytes 2(t&1), 2(t&1) + 1, i.e. k-pairs t and t + 4 of
    the MMA (elements 16h + 4t .. + 3 in pairs (e, e + 1)) — the order prep_tq4_1s_mma's B tiles hold the rotated
    activation in (formats.tq4_1s.to_mma_tiles). The constructor emits the lane's offsets; `tbl`, `lanec`, `copies`:
    the table mma_table_fill filled (copies None: the per-element table)."""

    def __init__(self, b, g, t, lane, tbl, lanec, copies, row_stride):
        self.b, self.g, self.tbl, self.lanec, self.copies, self.row_stride = b, g, tbl, lanec, copies, row_stride
        # row g's byte pair 2(t&1) of qs word t/2: the word's 16 bits as seen from word 1 of the half (+ 4 + 8h)
        self.lane_row = b.op("mad.lo.u32", g, Imm(row_stride, "u32"), b.op("shl.b32", t, Imm(1, "u32")))
        self.lane4 = b.op("shl.b32", lane, Imm(2, "u32"))  # the lane's copy in the per-element table

    def block_base(self, stage_base, bl):
        """Block bl of a ring stage's rows."""
        return self.b.op("add.u32", stage_base, Imm(bl * BLOCK_BYTES, "u32"))

    def row_scales(self, sm, mtiles):
        """Per row rr of the lane (row 16·(rr // 2) + g + 8·(rr % 2)) of the block at `sm`: (d0, d1) in fp32."""
        b, rs = self.b, self.row_stride
        dw = [b.op("ld.shared.u32", Mem(b.op("mad.lo.u32", self.g, Imm(rs, "u32"), sm), 8 * rs * rr))
              for rr in range(2 * mtiles)]  # rows g + 8rr
        return [scales(b, dw[rr]) for rr in range(2 * mtiles)]

    def qs_base(self, sm):
        """The lane's qs bytes of the block at `sm` (row g): fragments()' base."""
        return self.b.op("add.u32", sm, self.lane_row)

    def lookups(self, w):
        """The A registers of the two qs bytes in `w` (bits 0..15): [(hi, lo) fp16x2 of each byte's two elements]
        — one conflict-free 4-byte lookup per element (word 32·index + lane) and two prmt per byte; with a pair
        table one 8-byte lookup per byte."""
        b = self.b
        if self.copies:
            return [tuple(pair_lookup(b, w, j, self.lanec, self.copies, self.tbl, "u32")) for j in range(2)]
        e = []
        for sh in (7, 3, -1, -5):  # nibble n of w (bits 4n..4n+3) to bits 7..10: the table row
            x = b.op("shl.b32", w, Imm(sh, "u32")) if sh > 0 else b.op("shr.u32", w, Imm(-sh, "u32"))
            a = b.op("or.b32", b.op("and.b32", x, Imm(0x780, "b32")), self.lane4)
            e.append(b.op("ld.shared.u32", Mem(b.op("add.u32", a, self.tbl))))
        return [(b.op("prmt.b32", e[2 * i], e[2 * i + 1], Imm(0x5410, "b32")),
                 b.op("prmt.b32", e[2 * i], e[2 * i + 1], Imm(0x7632, "b32"))) for i in range(2)]

    def fragments(self, qb, h, mt):
        """Half block h of m16 tile mt from qs_base `qb`: the A fragments (hi, lo), each [(g, k-pair t), (g + 8, t),
        (g, t + 4), (g + 8, t + 4)]."""
        b, rs = self.b, self.row_stride
        words = [b.op("ld.shared.u16", Mem(qb, 4 + 8 * h + 8 * rs * (2 * mt + rr)), type="u32") for rr in range(2)]
        (a0h, a0l), (a2h, a2l) = self.lookups(words[0])  # row 16mt + g: k-pairs t, t + 4
        (a1h, a1l), (a3h, a3l) = self.lookups(words[1])  # row 16mt + g + 8
        return [a0h, a1h, a2h, a3h], [a0l, a1l, a2l, a3l]


# --- the few-token tensor-core GEMVs (kernels/gemv_t1.py _CodecStep: gemv_tq4_1s_mma_t{1,2,4,8}, on prep_rot16_t*'s
# records of the rotated activation): a step of 256 weights is 8 blocks, 160 bytes a row (rows a multiple of 16
# bytes: every step starts aligned). A 16-element half h of block j takes one MMA: fp16 hi(C[idx]) as its rows g, lo
# as its rows g + 8 (the same weight row, from the pair table below: mma_pair_table), then S += d_h·(C hi + C lo)
MMA_STEP_BYTES = GROUP_BLOCKS * BLOCK_BYTES  # 160
FEW_RECORD_ORDER = "rot16"  # the records' order (formats.tq4_1s.q4k_mma_records): the rotated activation's
MMA_A_PARTS = 2  # (hi, lo): the codebook is not exact in fp16
# the pair table, wide (MMA_TABLE_WIDE, where the build's rings leave room for it): 32 copies, 64 KB at the start of the
# dynamic shared memory, an entry at v·256 + 8·lane — the prmt that picks the byte builds the whole offset and ptxas
# folds the table's base into the LDS: prmt + LDS.64 a qs byte, 438 SASS a warp-step at T = 1; else 16 copies (a
# 64-bit lookup is served per half-warp: its 16 lanes on distinct banks), 32 KB of static shared memory, an entry at
# v·128 + 8·(lane % 16): prmt, LEA, LDS.64, 502 SASS. Neither timed yet.
MMA_TABLE_WIDE = True


def few_table(wide: bool) -> tuple[int, int]:
    """(copies, bytes) of the few-token builds' pair table, wide or not."""
    copies = 32 if wide else 16
    return copies, 256 * 8 * copies


def mma_lane_offset(b, t):
    """The lane's word of a block half's qs bytes (mma_block's word(off, lane=True)): 4·(t >> 1) — its bytes 2t,
    2t + 1 lie in the word lanes t and t ^ 1 share."""
    return b.op("shl.b32", b.op("and.b32", t, Imm(2, "b32")), Imm(1, "u32"))


def mma_constants(b, table) -> dict:
    """The pair table filled into shared memory (table = (its address, tid, lane, threads filling it, wide?); the
    caller's barrier publishes it) and what mma_block's lookups take: the prmt selectors that put the lane's qs byte
    2(t & 1) + j of its word into bits 0-7 (zeros above: the narrow table, then the lane's copy tc) or into bits
    8-15 beside 8·lane (the wide table, then its base)."""
    tbl, tid, lane, nthreads, wide = table
    copies = few_table(wide)[0]
    odd2 = b.op("shl.b32", b.op("and.b32", lane, Imm(1, "b32")), Imm(1, "u32"))  # 2(t & 1)
    if wide:  # byte 2(t & 1) + j into bits 8-15 beside 8·lane (bits 0-7): the entry's offset
        out = {"lane8": b.op("shl.b32", lane, Imm(3, "u32")), "tbl": tbl,
               "sel": [b.op("or.b32", b.op("shl.b32", b.op("add.u32", odd2, Imm(j, "u32")), Imm(4, "u32")),
                            Imm(0x5504, "b32")) for j in range(2)]}
    else:  # byte 2(t & 1) + j into bits 0-7, zeros above
        out = {"tc": b.op("mad.lo.u32", b.op("and.b32", lane, Imm(copies - 1, "b32")), Imm(8, "u32"), tbl),
               "sel": [b.op("or.b32", b.op("add.u32", odd2, Imm(j, "u32")), Imm(0x4440, "b32")) for j in range(2)]}
    filled = b.label("pair_table_filled")  # the first `nthreads` threads (a CTA may run more)
    b.bra(filled, pred=b.op("setp.ge.u32", tid, Imm(nthreads, "u32")))
    copy_pair_table(b, tbl, tid, lane, copies, nthreads, mma_pair_table().tobytes())
    b.place(filled)
    return out


class mma_block(UnitScaleBlock):  # noqa: N801 - a codec hook, named as the others
    """One row's 8 blocks (a step of 256 weights) for the few-token tensor-core GEMVs, in two A parts
    (MMA_A_PARTS: gemv_t1._CodecStep._parts_step): `fragment(s)` — the A registers of half s % 2 of block s // 2
    with the row's hi(C[idx]) as the MMA's rows g and lo(C[idx]) as its rows g + 8: [hi, lo] of elements (4t,
    4t + 1), then [hi, lo] of (4t + 2, 4t + 3) — qs bytes 8h + 2t and 8h + 2t + 1, each one LDS.64 of the pair table
    (its two elements' hi pair, then their lo pair, the low nibble's in the low half), straight into the MMA's
    register pairs —, `scale(s)`, that half's d as f32, and `d` = 1."""

    def fragment(self, s):
        b, c = self.b, self.c
        j, h = s // 2, s % 2
        w = self.word(j * BLOCK_BYTES + 4 + 8 * h, True)  # qs bytes 8h + 4(t >> 1) ..
        out = []
        for sel in c["sel"]:  # byte 2(t & 1) + j of the word: entry v at v·8·copies + 8·(lane % copies)
            hl = b.regs("b32", 2)  # (hi pair, lo pair)
            if "lane8" in c:  # MMA_TABLE_WIDE: v·256 + 8·lane by the prmt, plus the table's (constant) base
                at = b.op("add.u32", b.op("prmt.b32", w, c["lane8"], sel), c["tbl"])
            else:
                at = b.op("mad.lo.u32", b.op("prmt.b32", w, Imm(0, "b32"), sel), Imm(8 * 16, "u32"), c["tc"])
            b.emit("ld.shared.v2.u32", b.vec(hl), Mem(at))
            out += hl
        return out

    def scale(self, s):
        j = s // 2
        if j not in self._d:  # the block's scale word, once: (d0, d1)
            self._d[j] = scales(self.b, self.word(j * BLOCK_BYTES))
        return self._d[j][s % 2]
