"""dequantize_<fmt>: GGUF blocks → fp16, one warp per group of 256 weights, for every weight codec with a
`dequant_lane` (ptxgen/codecs): the values are formed in float32 exactly as ggml's dequantize_row_<fmt> does,
then rounded to fp16, so the result equals `formats.dequantize(fmt, ...).astype(float16)` bit for bit.
"""
from __future__ import annotations

from .. import codecs
from ..dsl import elementwise_head, warp_per_item
from ..ir import Imm, Mem
from . import KernelDef
from ..specs import CodecKernel

WARPS = 8
FORMATS = codecs.dequantizable()
_STORE = {1: "st.global.b32", 2: "st.global.v2.b32", 4: "st.global.v4.b32"}


def name(fmt: str) -> str:
    return CodecKernel("dequantize", fmt).name


def build(arch, fmt: str):
    codec = codecs.get(fmt)
    one = codec.GROUP_BLOCKS == 1
    doc = (f"{name(fmt)}: {fmt.upper()} super-blocks (GGUF byte layout) → fp16, one warp per 256-weight super-block."
           if one else
           f"{name(fmt)}: {fmt.upper()} blocks (GGUF byte layout) → fp16, one warp per {codec.GROUP_BLOCKS} blocks.")
    b, w, y, count = elementwise_head(name(fmt), arch, doc, "w", "y", "nsuper" if one else "nblocks", WARPS,
                                      "superblocks_per_cta" if one else "groups_per_cta")
    if not one:
        b.meta["blocks_per_group"] = codec.GROUP_BLOCKS
    groups = count if one else b.op("div.u32", b.op("add.u32", count, Imm(codec.GROUP_BLOCKS - 1, "u32")),
                                    Imm(codec.GROUP_BLOCKS, "u32"))
    lane, group, done = warp_per_item(b, groups, WARPS)
    runs, offsets, valid = codec.dequant_lane(b, w, group, lane, count)
    first, deltas = offsets()
    out = b.op("mad.wide.u32", first, Imm(2, "u32"), y)
    for words, delta in zip(runs, deltas):
        b.emit(_STORE[len(words)], Mem(out, 2 * delta), words[0] if len(words) == 1 else b.vec(words), pred=valid)
    b.place(done)
    b.emit("ret")
    return b.finish()


KERNELS = [KernelDef(name(f), f"{f.upper()} → fp16, bit-exact to ggml's float32 dequant rounded to fp16",
                     lambda arch, f=f: build(arch, f)) for f in FORMATS]
