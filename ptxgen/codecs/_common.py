"""What several codecs share."""
from __future__ import annotations

from .. import formats
from ..ir import Imm


def geometry(fmt: str, *fields: str) -> tuple[int, ...]:
    """(weights per block, bytes per block, then the byte offset of each of `fields` in the block), from the
    format's GGUF record (ptxgen.formats): a codec states none of them twice."""
    f = formats.get(fmt)
    return (f.block_size, f.block_bytes, *(f.dtype.fields[name][1] for name in fields))


def alignment_error(fmt: str, align: int):
    """A codec's `weights_error` that asks only for `align`-byte aligned weights (its kernels' widest load)."""
    def weights_error(mode: str, k: int, ptr: int) -> str | None:
        """Why mul_mat cannot take weights at device address `ptr` (K columns), or None."""
        return f"{fmt} weights must start {align}-byte aligned, pointer is {ptr:#x}" if ptr % align else None
    return weights_error


def block_lanes(b, group, lane, count, group_blocks: int):
    """The 32-weight-block codecs' warp step (Q8_0, TQ4_1S dequant_lane): lane L takes block
    group_blocks·group + L / 4, valid below `count` blocks, and its elements 8·(L % 4) .. + 7. Returns (block,
    valid, offsets) with offsets() the dequant_lane contract's (first element, (0,)): 256·group + 8·L."""
    blk = b.op("mad.lo.u32", group, Imm(group_blocks, "u32"), b.op("shr.u32", lane, Imm(2, "u32")))
    valid = b.op("setp.lt.u32", blk, count)

    def offsets():  # element 32·block + 8·(L % 4) = 256·group + 8·L
        return b.op("add.u32", b.op("shl.b32", group, Imm(8, "u32")), b.op("shl.b32", lane, Imm(3, "u32"))), (0,)
    return blk, valid, offsets
