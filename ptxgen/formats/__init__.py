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


def get(name: str) -> QuantFormat:
    """The format called `name` (ggml's spelling, e.g. "q4_K")."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; known: {', '.join(NAMES)}") from None


def dequantize(name: str, raw, shape) -> np.ndarray:
    """Raw bytes of whole rows of blocks → float32 array of `shape`."""
    return get(name).dequantize(raw, shape)


def quantize(name: str, x, *, allow_nonfinite: bool = False, **options) -> np.ndarray:
    """float32 array (last dim a multiple of the block size) → uint8 blocks, rows kept. Weight formats refuse
    NaN / ±inf unless `allow_nonfinite=True` (QuantFormat.quantize); q8_1 (activations) passes them through.
    q8_1 takes `s_mode` ("sum_x", the kernels' meaning, or "d_sum_q", ggml's CPU meaning)."""
    return get(name).quantize(x, allow_nonfinite=allow_nonfinite, **options)


__all__ = [
    "QuantFormat", "FORMATS", "NAMES", "get", "dequantize", "quantize", "quantize_q8_1",
    "gemm_ref", "gemm_q8_1_ref", "mul_mat_id_ref", "gemv_tq4_1s_ref", "gemv_tq4_1s_fast_ref", "rht_forward",
    "rht_inverse", "unpack_scale_min_k4",
]
