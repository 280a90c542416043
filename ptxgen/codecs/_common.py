"""What several codecs share."""
from __future__ import annotations


def alignment_error(fmt: str, align: int):
    """A codec's `weights_error` that asks only for `align`-byte aligned weights (its kernels' widest load)."""
    def weights_error(mode: str, k: int, ptr: int) -> str | None:
        """Why mul_mat cannot take weights at device address `ptr` (K columns), or None."""
        return f"{fmt} weights must start {align}-byte aligned, pointer is {ptr:#x}" if ptr % align else None
    return weights_error
