"""How the tensor cores add up an f16/bf16 → f32 matrix product, fitted on the H200 and checked bit for bit
(bench/probe_mma_rounding.py recorded 8192 mma.sync m16n8k16 on random fragments with wide exponent
spreads; this model reproduces all 1,048,576 outputs; the plain "exact sum, rounded once" model misses 47%).

For each output element, per k16 instruction: the 16 products a·b are exact; every term (the products and
the accumulator c) is aligned to the largest *nominal* exponent among them — for a product, exp(a) + exp(b)
of the inputs' own exponents, not the product's normalised one — and truncated to multiples of
2^(emax − 25); the truncated terms are summed exactly and the sum is rounded toward zero to fp32.
Terms that are inf or NaN fall back to the IEEE sum. wgmma m64nNk16 is modelled the same way (the GPU's
mma.sync and wgmma MMQ kernels give bit-identical outputs on the same inputs).
"""
from __future__ import annotations

import numpy as np

_ZERO_EXP = -10_000  # the exponent a zero term gets: it never sets the alignment


def _exponent(x: np.ndarray) -> np.ndarray:
    _, e = np.frexp(x)  # x = m·2^e with |m| in [0.5, 1): floor(log2|x|) = e − 1
    return np.where(x == 0, _ZERO_EXP, e.astype(np.int64) - 1)


def round_toward_zero_f32(x: np.ndarray) -> np.ndarray:
    r = x.astype(np.float32)
    with np.errstate(invalid="ignore"):
        over = np.isfinite(x) & (np.abs(r.astype(np.float64)) > np.abs(x))
    return np.where(over, np.nextafter(r, np.float32(0)), r).astype(np.float32)


def mma_f32(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> np.ndarray:
    """D = A·B + C for one k16 tensor-core step: A [..., M, K], B [..., K, N] (f16/bf16 values as float64),
    C [..., M, N] (f32 values as float64) → float32 [..., M, N]."""
    with np.errstate(invalid="ignore", over="ignore"):
        P = A[..., :, None, :] * np.swapaxes(B, -1, -2)[..., None, :, :]  # [..., M, N, K]
        ep = _exponent(A)[..., :, None, :] + _exponent(np.swapaxes(B, -1, -2))[..., None, :, :]
        ep = np.where((A[..., :, None, :] == 0) | (np.swapaxes(B, -1, -2)[..., None, :, :] == 0), _ZERO_EXP, ep)
        emax = np.maximum(ep.max(axis=-1), _exponent(C))
        q = np.exp2(np.maximum(emax - 25, -1100).astype(np.float64))
        s = (np.trunc(P / q[..., None]) * q[..., None]).sum(axis=-1) + np.trunc(C / q) * q
        s = np.where(emax == _ZERO_EXP, 0.0, s)
        finite = np.isfinite(P).all(axis=-1) & np.isfinite(C)
        ieee = P.sum(axis=-1) + C
    return np.where(finite, round_toward_zero_f32(s), ieee.astype(np.float32)).astype(np.float32)
