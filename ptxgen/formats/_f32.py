"""float32 arithmetic in C's order: the building blocks the bit-exact quantizers share.

ggml's reference quantizers accumulate sums one element at a time in float32 (no FMA contraction in
the reference build). NumPy's `sum` is pairwise, so every accumulation here walks the element axis
sequentially while staying vectorised over blocks.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=F32)


def seq_sum(terms: np.ndarray, axis: int = -1) -> np.ndarray:
    """Sum along `axis` one element at a time in float32, as a C `for` loop does."""
    t = np.moveaxis(f32(terms), axis, -1)
    acc = np.zeros(t.shape[:-1], F32)
    for i in range(t.shape[-1]):
        acc = acc + t[..., i]
    return acc


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's `nearest_int`: add 1.5·2^23 in float32 and read the mantissa (ties to even)."""
    with np.errstate(invalid="ignore", over="ignore"):
        bits = (f32(v) + F32(12582912.0)).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def roundf(v: np.ndarray) -> np.ndarray:
    """C `roundf`: halves away from zero."""
    v = f32(v)
    return np.where(v >= 0, np.floor(v + F32(0.5)), np.ceil(v - F32(0.5))).astype(F32)


def to_half(v: np.ndarray) -> np.ndarray:
    """fp32 → fp16, round to nearest even (GGML_FP32_TO_FP16); overflow gives ±inf."""
    with np.errstate(over="ignore", invalid="ignore"):
        return f32(v).astype(np.float16)


def half_bits(v: np.ndarray) -> np.ndarray:
    return to_half(v).view(np.uint16)


def from_half_bits(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(F32)


def xor_tree_sum(v: np.ndarray) -> np.ndarray:
    """Sum the last axis (32 lanes) the way a `shfl.xor` butterfly with offsets 16, 8, 4, 2, 1 does.

    Every lane ends with the same value (addition commutes), so this is what a warp reduction in our
    kernels produces bit for bit.
    """
    v = f32(v)
    n = v.shape[-1]
    lanes = np.arange(n)
    off = n // 2
    while off >= 1:
        v = v + v[..., lanes ^ off]
        off //= 2
    return v[..., 0]
