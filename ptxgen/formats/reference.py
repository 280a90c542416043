"""float64 GEMM references: what each kernel must compute, from the dequantized weights."""
from __future__ import annotations

import operator

import numpy as np

from . import ggml, tq4_1s


def _check_weights(what: str, fmt: str, raw, rows: int, k: int, shown: str) -> None:
    """`raw` holds `rows` rows of K weights of `fmt`: a wrong byte count, or a K that is not whole blocks, is named
    here with what was expected, not found later by NumPy."""
    from . import get

    f = get(fmt)
    try:
        row = f.row_bytes(k)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    n = len(raw) if isinstance(raw, (bytes, bytearray, memoryview)) else np.asarray(raw).size
    if n != rows * row:
        held = f" (that is {n // row} rows of K={k})" if n % row == 0 else ""
        raise ValueError(f"{what}: {f.name} {shown} needs {rows * row} bytes of raw ({row} per row of K={k}), "
                         f"got {n}{held}")


def _check_gemm(what: str, fmt: str, raw, m, k, x) -> tuple[int, int, np.ndarray]:
    """(m, k, x as an array) once m, k are positive ints, `raw` holds (M, K) of `fmt` and x is (T, K): one
    ValueError with the expected and the actual shapes, not matmul's "mismatch in its core dimension"."""
    try:
        m, k = operator.index(m), operator.index(k)
    except TypeError:
        raise TypeError(f"{what}(fmt, raw, m, k, x): m and k must be ints, got {m!r}, {k!r}") from None
    if m <= 0 or k <= 0:
        raise ValueError(f"{what}: (M, K) = ({m}, {k}) must be positive")
    _check_weights(what, fmt, raw, m, k, f"(M, K) = ({m}, {k})")
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != k:
        if x.ndim == 1 and x.shape[0] == k:
            hint = " (one token: pass x[None, :])"
        elif x.ndim == 2 and x.shape[0] == k:
            hint = " (transposed? pass x.T)"
        elif x.ndim == 2 and x.shape[1] == m:
            hint = f" (m and k swapped? {what} takes (fmt, raw, m, k, x), W of M rows of K weights)"
        else:
            hint = ""
        raise ValueError(f"{what}: x must be (T, K) = (T, {k}) for W (M, K) = ({m}, {k}), got shape {x.shape}{hint}")
    return m, k, x


def gemm_ref(fmt: str, raw, m: int, k: int, x: np.ndarray) -> np.ndarray:
    """y = x @ W.T in float64, W dequantized from `raw` (M × K), x of shape (T, K)."""
    from . import dequantize

    m, k, x = _check_gemm("gemm_ref", fmt, raw, m, k, x)
    w = dequantize(fmt, raw, (m, k)).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # (inf / NaN in x or W: IEEE results, no warning)
        return np.asarray(x, np.float64) @ w.T


def mul_mat_id_ref(fmt: str, raw, shape, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """ggml's MUL_MAT_ID in float64: y[t, j] = x[t] @ W[ids[t, j]].T (x (T, K)), or x[t, j] @ ... (x (T, slots, K)),
    W (E, M, K) dequantized from `raw`; y (T, slots, M); a slot whose id is outside [0, E) is NaN."""
    from . import dequantize

    try:
        e, m, k = (operator.index(d) for d in shape)
    except (TypeError, ValueError):
        raise ValueError(f"mul_mat_id_ref: shape must be (E, M, K) ints, got {shape!r}") from None
    _check_weights("mul_mat_id_ref", fmt, raw, e * m, k, f"(E, M, K) = ({e}, {m}, {k})")
    ids = np.asarray(ids)
    x = np.asarray(x)
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        raise ValueError(f"mul_mat_id_ref: ids must be integer (T, slots), got {ids.dtype} of shape {ids.shape}")
    if x.ndim not in (2, 3) or x.shape[-1] != k or x.shape[:x.ndim - 1] != ids.shape[:x.ndim - 1]:
        raise ValueError(f"mul_mat_id_ref: x must be (T, K) = ({ids.shape[0]}, {k}) or (T, slots, K) = "
                         f"({ids.shape[0]}, {ids.shape[1]}, {k}) for ids {ids.shape} and W (E, M, K) = "
                         f"({e}, {m}, {k}), got shape {x.shape}")
    w = dequantize(fmt, raw, (e * m, k)).astype(np.float64).reshape(e, m, k)
    x = x.astype(np.float64)
    xs = x if x.ndim == 3 else np.broadcast_to(x[:, None, :], (*ids.shape, k))
    y = np.full((*ids.shape, m), np.nan)
    for expert in range(e):  # each expert's pairs at once (no (T, slots, M, K) gather)
        sel = ids == expert
        y[sel] = xs[sel] @ w[expert].T
    return y


def gemm_q8_1_ref(fmt: str, raw, m: int, k: int, x: np.ndarray) -> np.ndarray:
    """What an int8 kernel computes: activations quantized to Q8_1 (s_mode "sum_x") first.

    y = x_q @ W.T with x_q the dequantized Q8_1 activations, in float64. The integer dot products
    are exact, so a correct kernel differs only by fp32 rounding of scales and partial sums.
    """
    m, k, x = _check_gemm("gemm_q8_1_ref", fmt, raw, m, k, x)
    x = x.astype(np.float32)
    q = ggml.quantize_q8_1(x.reshape(-1, 32))
    xq = ggml.dequantize_q8_1(q).reshape(x.shape)
    return gemm_ref(fmt, raw, m, k, xq)


def gemv_tq4_1s_ref(raw, m: int, k: int, x: np.ndarray) -> np.ndarray:
    """Fused TQ4_1S reference: y[t, r] = Σ_b <C[idx]·d, forward_rht(x_b)>, float64 accumulation."""
    from . import get

    m, k, x = _check_gemm("gemv_tq4_1s_ref", "tq4_1s", raw, m, k, x)
    blocks = get("tq4_1s").blocks(raw, (m, k))
    w_rot = tq4_1s.rotated_values(blocks).reshape(m, k).astype(np.float64)
    a = tq4_1s.rht_forward(x.astype(np.float32)).astype(np.float64)
    return a @ w_rot.T


def gemv_tq4_1s_fast_ref(raw, m: int, k: int, x: np.ndarray) -> np.ndarray:
    """What the "fast" TQ4_1S GEMV computes: forward_rht(x) quantized to Q8_1, the int8 codebook, integer
    dot products per half-block, then d_w·d_a·isum·2.733/127 summed in float64."""
    from . import get

    m, k, x = _check_gemm("gemv_tq4_1s_fast_ref", "tq4_1s", raw, m, k, x)
    blocks = get("tq4_1s").blocks(raw, (m, k))
    nb = k // 32
    a = tq4_1s.rht_forward(x.astype(np.float32))
    t = a.shape[0]
    qb = ggml.quantize_q8_1(a.reshape(-1, 32)).reshape(t, nb, 36)
    qa = qb[:, :, 4:].copy().view(np.int8).astype(np.int64)  # (t, nb, 32)
    da = qb[:, :, 0:2].copy().view("<f2").astype(np.float64)[..., 0]  # (t, nb)
    w8 = tq4_1s.CODEBOOK_S8[tq4_1s.indices(blocks)].astype(np.int64).reshape(m, nb, 2, 16)
    dw = blocks[:, 0:4].copy().view("<f2").astype(np.float64).reshape(m, nb, 2)
    isum = np.einsum("rbhl,tbhl->trbh", w8, qa.reshape(t, nb, 2, 16))
    return np.einsum("trbh,rbh,tb->tr", isum, dw, da) * float(tq4_1s.FAST_RESCALE)
