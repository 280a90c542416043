"""The Q8_0 weight codec: GGUF's block_q8_0 — d (fp16), 32 int8 quants: 34 bytes per 32 weights (blocks only 2-byte
aligned), w = q·d."""
from __future__ import annotations

from ..ir import Imm, Mem
from ._common import block_lanes, geometry

FMT = "q8_0"
BLOCK_K, BLOCK_BYTES = geometry(FMT)  # 32, 34
GROUP_BLOCKS = 8  # a warp dequantizes 8 blocks (256 weights) at once
LOAD_ALIGN = 2
ROUTES = {"exact": ("mmq_pre", "codec_gemv"), "fast": ("fast_lanes",)}  # mul_mat's routes (runtime/ops.py) per mode


def weights_error(mode: str, k: int, ptr: int) -> str | None:
    """Why mul_mat cannot take weights at device address `ptr` (K columns), or None: the int8 GEMV reads 4-byte
    words over pairs of blocks."""
    if mode == "fast" and (k % 64 or ptr % 4):
        return f"q8_0 in mode='fast' needs K a multiple of 64 and 4-byte aligned weights (K={k}, pointer {ptr:#x})"
    return f"q8_0 weights must start 2-byte aligned, pointer is {ptr:#x}" if ptr % 2 else None


def dequant_lane(b, w, group, lane, count, f32: bool = False):
    """dequantize_q8_0's step: lane L takes block 8·group + L / 4 (valid below `count` blocks) and its quants
    8·(L % 4) .. + 7 (four 2-byte loads: the block is 2-byte aligned); w = q·d in float32 as ggml, then fp16: one
    run of 4 f16x2 words (f32: of 8 f32 values). As q4_k.dequant_lane."""
    b.comment("dequant q8_0: int8 pairs -> q·d -> fp16")
    blk, valid, offsets = block_lanes(b, group, lane, count, GROUP_BLOCKS)
    block = b.op("mad.wide.u32", blk, Imm(BLOCK_BYTES, "u32"), w)
    run = b.op("shl.b32", b.op("and.b32", lane, Imm(3, "b32")), Imm(3, "u32"))  # 8·(L % 4)
    qs = b.op("add.s64", block, b.op("cvt.u64.u32", run))
    dbits = b.reg("b16")
    b.emit("mov.b16", dbits, Imm(0, "b16"))
    b.emit("ld.global.nc.b16", dbits, Mem(block), pred=valid)
    d = b.op("cvt.f32.f16", dbits)
    words = []
    for i in range(4):
        pair = b.op("mov.u32", Imm(0, "u32"))
        b.emit("ld.global.nc.u16", pair, Mem(qs, 2 + 2 * i), pred=valid)
        q = [b.op("bfe.s32", pair, Imm(8 * j, "u32"), Imm(8, "u32"), type="s32") for j in range(2)]
        v = [b.op("mul.rn.f32", b.op("cvt.rn.f32.s32", qj), d) for qj in q]
        if f32:
            words += v
        else:
            words.append(b.op("cvt.rn.f16x2.f32", v[1], v[0], type="b32"))
    return [words], offsets, valid


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
