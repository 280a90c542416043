"""The TQ4_1S weight codec (TurboQuant's 4-bit format, ptxgen/formats/tq4_1s.py): 20 bytes per 32 weights — d0, d1
(fp16: elements 0-15, 16-31), 16 bytes of codebook indices (element j: the low nibble of byte j / 2 when j is even)
— whose values C[idx]·d are the weights in the rotated domain: y = Σ_b <C[idx]·d, forward_rht(x_b)>, so every
kernel over it multiplies a rotated activation (ROTATION). Its decode GEMVs keep their own decodes
(kernels/gemv.py); `run8` / `dequant_lane` give the prepared prefill (fragments, fixup) the same fp32 values."""
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
ROUTES = {"exact": ("mmq_pre", "decode_tq4"), "fast": ("fast_lanes",)}  # mul_mat's routes (runtime/ops.py) per mode


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
    inrow = b.op("min.u32", blk, b.op("sub.u32", count, Imm(1, "u32")))  # a lane past the row reads its last block
    k0 = b.op("mad.lo.u32", inrow, Imm(BLOCK_K, "u32"), b.op("shl.b32", b.op("and.b32", lane, Imm(3, "b32")), Imm(3, "u32")))
    vals = run8(b, w, k0)  # (those lanes' values are multiplied by predicated-off zeros)
    return [vals], offsets, valid
