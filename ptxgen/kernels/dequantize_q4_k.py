"""dequantize_q4_k: Q4_K super-blocks (GGUF byte layout) → fp16, one warp per 256-weight super-block.

Lane L owns 32-bit word L of `qs`: 4 low nibbles of sub-block 2c and 4 high nibbles of sub-block 2c+1
(c = L/8). The values are formed in float32 exactly as ggml's dequantize_row_q4_K does, then rounded to
fp16, so the result equals `formats.dequantize("q4_K", ...).astype(float16)` bit for bit.
"""
from __future__ import annotations

from ..dsl import ConvertHalf, dequant_q4_k_word, elementwise_head, warp_per_item
from ..ir import Imm, Mem
from . import KernelDef

WARPS = 8


def build(arch):
    b, w, y, nsuper = elementwise_head("dequantize_q4_k", arch, __doc__.splitlines()[0], "w", "y", "nsuper", WARPS,
                                       "superblocks_per_cta")
    lane, sb, done = warp_per_item(b, nsuper, WARPS)

    block = b.op("mad.wide.u32", sb, Imm(144, "u32"), w)
    chunk = b.op("shr.u32", lane, Imm(3, "u32"))
    sub_lo = b.op("shl.b32", chunk, Imm(1, "u32"))
    env = {"block": block, "sub_lo": sub_lo, "sub_hi": b.op("add.u32", sub_lo, Imm(1, "u32")),
           "qword": b.op("ld.global.nc.u32", Mem(b.op("mad.wide.u32", lane, Imm(4, "u32"), block), 16))}
    seq = dequant_q4_k_word().then(ConvertHalf("w_lo", "h_lo"), ConvertHalf("w_hi", "h_hi"))
    seq.lower(b, env)

    # element index of the low-nibble run: 256·sb + 64·c + 4·(L % 8); the high run is 32 further
    p = b.op("shl.b32", b.op("and.b32", lane, Imm(7, "b32")), Imm(2, "u32"))
    e = b.op("add.u32", b.op("shl.b32", sb, Imm(8, "u32")), b.op("mad.lo.u32", chunk, Imm(64, "u32"), p))
    out = b.op("mad.wide.u32", e, Imm(2, "u32"), y)
    b.emit("st.global.v2.b32", Mem(out), b.vec(env["h_lo"]))
    b.emit("st.global.v2.b32", Mem(out, 64), b.vec(env["h_hi"]))
    b.place(done)
    b.emit("ret")
    return b.finish()


KERNEL = KernelDef("dequantize_q4_k", "Q4_K → fp16, bit-exact to ggml's float32 dequant rounded to fp16", build)
