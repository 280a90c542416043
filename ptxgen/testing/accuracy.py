"""How far a kernel's product is from its float64 reference, measured so that a result whose terms cancel is not
held to a bound no rounded operand can meet.

A kernel that rounds x (or a weight) to fp16 makes each term w·x wrong by up to 2^-11 of itself, so the error of an
output y_ij = Σ_k w_ik·x_jk is about 2^-11 / √3 · s_ij with s_ij = √(Σ_k w_ik²·x_jk²) — the products' scale —
whatever y_ij itself is. ‖got − want‖ / ‖want‖ divides by the result instead: where many outputs are compared
‖want‖ ≈ ‖s‖ (random signs) and the two agree, but one output whose sum cancels (M = T = 1) makes it arbitrary: with
fp16 x alone it exceeds the fp16 GEMMs' 1e-3 in ~15% of random Q4_K draws. `rel_error` therefore divides by
max(‖want‖, ‖s‖): the same measure wherever the result is as large as its terms allow, the rounding bound where it
is not."""
from __future__ import annotations

import numpy as np

from ptxgen import formats


def _squares(fmt: str, raw, rows: int, k: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(W², x²) in float32, W (rows, K) dequantized from `raw`; TQ4_1S in the rotated domain its kernels multiply
    in: rht_forward(x) against the codebook values."""
    if fmt == "tq4_1s":
        w = formats.tq4_1s.rotated_values(formats.get(fmt).blocks(raw, (rows, k))).reshape(rows, k)
        x = formats.rht_forward(np.asarray(x, np.float32).reshape(-1, k)).reshape(np.shape(x))
    else:
        w = formats.dequantize(fmt, raw, (rows, k))
    with np.errstate(over="ignore", invalid="ignore"):
        return np.square(np.asarray(w, np.float32)), np.square(np.asarray(x, np.float32))


def product_scale(fmt: str, raw, m: int, k: int, x: np.ndarray) -> np.ndarray:
    """s (T, M): √(Σ_k w_ik²·x_jk²) for W (M, K) of `fmt` dequantized from `raw` and x (T, K). float32 is plenty
    for a scale."""
    w2, x2 = _squares(fmt, raw, m, k, x)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.sqrt(x2 @ w2.T)


def mul_mat_id_scale(fmt: str, raw, shape, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """product_scale of formats.mul_mat_id_ref's product: s (T, slots, M), each pair against its expert's rows (x
    (T, K) shared by the slots, or (T, slots, K)); NaN where the id is outside [0, E), as the reference."""
    e, m, k = shape
    ids = np.asarray(ids)
    w2, x2 = _squares(fmt, raw, e * m, k, x)
    w2 = w2.reshape(e, m, k)
    x2 = x2 if x2.ndim == 3 else np.broadcast_to(x2[:, None, :], (*ids.shape, k))
    s = np.full((*ids.shape, m), np.nan, np.float32)
    for expert in range(e):
        sel = ids == expert
        with np.errstate(over="ignore", invalid="ignore"):
            s[sel] = np.sqrt(x2[sel] @ w2[expert].T)
    return s


def rel_error(got, want, scale=None) -> float:
    """‖got − want‖ / ‖want‖ in float64; with `scale` (product_scale of the same product, or the entries of it that
    `got` holds), ‖got − want‖ / max(‖want‖, ‖scale‖). 0 where both are 0."""
    want = np.asarray(want, np.float64)
    num = float(np.linalg.norm(np.asarray(got, np.float64) - want))
    den = float(np.linalg.norm(want))
    if scale is not None:
        den = max(den, float(np.linalg.norm(np.asarray(scale, np.float64))))
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def gemm_rel_error(got, fmt: str, raw, m: int, k: int, x: np.ndarray) -> float:
    """rel_error of `got` against formats.gemm_ref(fmt, raw, m, k, x), scaled by product_scale."""
    return rel_error(got, formats.gemm_ref(fmt, raw, m, k, x), product_scale(fmt, raw, m, k, x))
