"""Weight and activation block formats as NumPy references: `get`, `dequantize`, `quantize`, and the GEMM
references every kernel is judged against.

Names are spelled as ggml spells them: q4_K, q5_K, q6_K, q8_0, q8_1, tq4_1s.
"""
from __future__ import annotations

import numpy as np

from . import ggml, tq4_1s
from .base import QuantFormat
from .ggml import quantize_q8_1, unpack_scale_min_k4
from .reference import gemm_q8_1_ref, gemm_ref, gemv_tq4_1s_fast_ref, gemv_tq4_1s_ref, mul_mat_id_ref
from .tq4_1s import rht_forward, rht_inverse

FORMATS: dict[str, QuantFormat] = {**ggml.FORMATS, "tq4_1s": tq4_1s.FORMAT}
NAMES = tuple(FORMATS)
_BY_LOWER = {n.lower(): n for n in NAMES}


def get(name: str) -> QuantFormat:
    """The format called `name` (ggml's spelling, e.g. "q4_K"; any letter case is taken)."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        pass
    if isinstance(name, str) and name.lower() in _BY_LOWER:  # "Q4_K", "q4_k": as README and GGUF tools write them
        return FORMATS[_BY_LOWER[name.lower()]]
    raise ValueError(f"unknown format {name!r}; known: {', '.join(NAMES)}")


def dequantize(name: str, raw, shape) -> np.ndarray:
    """Raw bytes of whole rows of blocks → float32 array of `shape`."""
    return get(name).dequantize(raw, shape)


def quantize(name: str, x, *, allow_nonfinite: bool = False, **options) -> np.ndarray:
    """float32 array (last dim a multiple of the block size) → uint8 blocks, rows kept. Weight formats refuse
    NaN / ±inf unless `allow_nonfinite=True` (QuantFormat.quantize); q8_1 (activations) passes them through.
    q8_1 takes `s_mode` ("sum_x", the kernels' meaning, or "d_sum_q", ggml's CPU meaning)."""
    return get(name).quantize(x, allow_nonfinite=allow_nonfinite, **options)


# the most |w| a block can hold per unit of its fp16 scale fields (each at most 1 in magnitude): Q4_K
# d·sc·q − dmin·m (sc, m 6-bit, q 4-bit; Q5_K's q 5-bit), Q6_K d·sc·(q − 32) (sc int8, q 6-bit), Q8_0 d·q
# (q int8), TQ4_1S d·C[q] (C its codebook; the rotated-domain weights its kernels hold)
WEIGHT_PER_SCALE = {"q4_K": 63 * 15 + 63, "q5_K": 63 * 31 + 63, "q6_K": 128 * 32, "q8_0": 128,
                    "tq4_1s": float(np.abs(tq4_1s.CODEBOOK).max())}
_FINITE_HALVES = np.arange(1 << 15, dtype=np.uint16).view(np.float16)  # +0 .. +inf, NaN past it
_FINITE_HALVES = _FINITE_HALVES[np.isfinite(_FINITE_HALVES)].astype(np.float64)


def fp16_weight_scale(name: str) -> float:
    """The largest fp16 value whose magnitude bounds every scale field of format `name` so that every weight its
    blocks can express fits in fp16 (|w| ≤ 65504): Q4_K 64.94, Q5_K 32.47, Q6_K 15.99, Q8_0 511.75, TQ4_1S 23968.
    Kernels that hold the weights in fp16 (the GEMMs) take tensors whose `max_scale` is within it."""
    return float(_FINITE_HALVES[_FINITE_HALVES * WEIGHT_PER_SCALE[name] <= 65504].max())


def max_scale(name: str, raw, shape) -> float:
    """The largest |fp16 scale field| (d, dmin, ...) over the blocks of `raw` (shape (..., K)); inf if one is inf
    or NaN. One pass over the blocks' headers."""
    fmt = get(name)
    top = 0.0
    for v in fmt.scale_fields(fmt.fields(raw, shape)):
        v = np.abs(v)
        if v.size:
            top = max(top, float(np.inf if np.isnan(v).any() else v.max()))
    return top


__all__ = [
    "QuantFormat", "FORMATS", "NAMES", "get", "dequantize", "quantize", "quantize_q8_1",
    "gemm_ref", "gemm_q8_1_ref", "mul_mat_id_ref", "gemv_tq4_1s_ref", "gemv_tq4_1s_fast_ref", "rht_forward",
    "rht_inverse", "unpack_scale_min_k4", "WEIGHT_PER_SCALE", "fp16_weight_scale", "max_scale",
]
