"""GGML block formats (Q4_K, Q5_K, Q6_K, Q8_0, Q8_1): byte layouts, dequantizers and ggml's reference
quantizers, written from `../shared/specs/GGML_FORMATS.md` and ggml's `ggml-quants.c` algorithm.

Everything is float32 in ggml's operation order so that the results are byte-identical to ggml's
reference build (gcc, no FMA contraction). Non-finite fp16 scale fields are not special-cased: they flow
through IEEE float32 arithmetic exactly as in ggml's C code (e.g. d = inf with sc = 0 gives NaN).
"""
from __future__ import annotations

import numpy as np

from ._f32 import F32, f32, from_half_bits, half_bits, nearest_int, roundf, seq_sum, xor_tree_sum
from .base import QuantFormat

QK_K = 256
GROUP_MAX_EPS = F32(1e-15)

Q4_K_DTYPE = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))])
Q5_K_DTYPE = np.dtype(
    [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qh", "u1", (32,)), ("qs", "u1", (128,))]
)
Q6_K_DTYPE = np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2")])
Q8_0_DTYPE = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])
Q8_1_DTYPE = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (32,))])


def _half(blocks: np.ndarray, offset: int) -> np.ndarray:
    return from_half_bits(blocks[:, offset:offset + 2].copy().view("<u2")[:, 0])


# ---------------------------------------------------------------------------------------------------
# Q4_K / Q5_K shared pieces

def unpack_scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 packed bytes → (sc, m), each (n, 8) uint8 with 6-bit values (ggml's get_scale_min_k4)."""
    q = scales.astype(np.uint8)
    sc = np.empty(q.shape[:-1] + (8,), np.uint8)
    m = np.empty_like(sc)
    sc[..., :4] = q[..., 0:4] & 63
    m[..., :4] = q[..., 4:8] & 63
    sc[..., 4:] = (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)
    m[..., 4:] = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    return sc, m


def pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Inverse of `unpack_scale_min_k4` for 6-bit values."""
    ls = ls.astype(np.uint8)
    lm = lm.astype(np.uint8)
    q = np.zeros(ls.shape[:-1] + (12,), np.uint8)
    q[..., 0:4] = ls[..., :4] | ((ls[..., 4:] >> 4) << 6)
    q[..., 4:8] = lm[..., :4] | ((lm[..., 4:] >> 4) << 6)
    q[..., 8:12] = (ls[..., 4:] & 0xF) | ((lm[..., 4:] & 0xF) << 4)
    return q


def _nibbles_k(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes → (n, 256) 4-bit values in Q4_K/Q5_K weight order (chunks of 64: low, then high)."""
    c = qs.reshape(-1, 4, 32)
    return np.stack([c & 0xF, c >> 4], axis=2).reshape(-1, 256)


def _qh_bits_k5(qh: np.ndarray) -> np.ndarray:
    """(n, 32) → (n, 256) fifth bits: sub-block j takes bit j of qh[l]."""
    bits = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    return bits.reshape(-1, 256)


def _dequant_k(blocks, nbits_q, q):
    d = _half(blocks, 0)[:, None]
    dmin = _half(blocks, 2)[:, None]
    sc, m = unpack_scale_min_k4(blocks[:, 4:16])
    with np.errstate(invalid="ignore", over="ignore"):
        d1 = np.repeat(d * sc.astype(F32), 32, axis=1)
        m1 = np.repeat(dmin * m.astype(F32), 32, axis=1)
        return d1 * q.astype(F32) - m1


def dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    return _dequant_k(blocks, 4, _nibbles_k(blocks[:, 16:144]))


def dequantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    q = _nibbles_k(blocks[:, 48:176]) + 16 * _qh_bits_k5(blocks[:, 16:48])
    return _dequant_k(blocks, 5, q)


# ---------------------------------------------------------------------------------------------------
# ggml's make_qkx2_quants / make_qx_quants, vectorised over rows of `x`

def make_qkx2_quants(x, weights, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Asymmetric (scale, min) search. x, weights: (n, 32). Returns (scale, the_min, L uint8 (n, 32))."""
    x = f32(x)
    w = f32(weights)
    n = x.shape[1]
    mn = x[:, 0].copy()
    mx = x[:, 0].copy()
    sum_w = w[:, 0].copy()
    sum_x = sum_w * x[:, 0]
    for i in range(1, n):
        mn = np.where(x[:, i] < mn, x[:, i], mn)
        mx = np.where(x[:, i] > mx, x[:, i], mx)
        sum_w = sum_w + w[:, i]
        sum_x = sum_x + w[:, i] * x[:, i]
    mn = np.where(mn > 0, F32(0), mn)
    flat = mx == mn
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rng = mx - mn
        iscale = F32(nmax) / rng
        scale = F32(1) / iscale
        L = np.clip(nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax)
        Lf = L.astype(F32)
        diff = scale[:, None] * Lf + mn[:, None] - x
        best_error = seq_sum(w * (diff * diff))
        for step in range(nstep + 1):
            # ggml updates `min` in place, so later steps measure from the best min so far
            iscale = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / (mx - mn)
            laux = np.clip(nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax)
            la = laux.astype(F32)
            wl = w * la
            sum_l = seq_sum(wl)
            sum_l2 = seq_sum(wl * la)
            sum_xl = seq_sum(wl * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_min = np.where(pos, F32(0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            diff = this_scale[:, None] * la + this_min[:, None] - x
            cur_error = seq_sum(w * (diff * diff))
            take = (D > 0) & (cur_error < best_error)
            L = np.where(take[:, None], laux, L)
            best_error = np.where(take, cur_error, best_error)
            scale = np.where(take, this_scale, scale)
            mn = np.where(take, this_min, mn)
    scale = np.where(flat, F32(0), scale).astype(F32)
    L = np.where(flat[:, None], 0, L)
    return scale, (-mn).astype(F32), L.astype(np.uint8)


def make_qx_quants_rmse1(x, nmax: int):
    """Symmetric scale search with weights x² (rmse_type 1, no importance). x: (n, 16).
    Returns (scale, L) with L = l + nmax in 0..2·nmax-1."""
    x = f32(x)
    n = x.shape[1]
    amax = np.zeros(x.shape[0], F32)
    mx = np.zeros(x.shape[0], F32)
    for i in range(n):
        ax = np.abs(x[:, i])
        gt = ax > amax
        amax = np.where(gt, ax, amax)
        mx = np.where(gt, x[:, i], mx)
    zero = amax < GROUP_MAX_EPS
    w = x * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        def sums(iscale):
            l = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
            lf = l.astype(F32)
            return l, seq_sum(w * x * lf), seq_sum(w * lf * lf)

        iscale = F32(-nmax) / mx
        l, sumlx, suml2 = sums(iscale)
        L = l + nmax
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(F32(nmax) + F32(0.1) * F32(step)) / mx
            l, sumlx, suml2 = sums(iscale)
            take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            L = np.where(take[:, None], l + nmax, L)
            scale = np.where(take, sumlx / suml2, scale)
            best = np.where(take, scale * sumlx, best)
    scale = np.where(zero, F32(0), scale).astype(F32)
    L = np.where(zero[:, None], 0, L)
    return scale, L.astype(np.int32)


def _quantize_k(x: np.ndarray, nmax: int, rmin: float, nstep: int):
    """Shared Q4_K/Q5_K super-block quantizer. x: (n, 256). Returns (d bits, dmin bits, scales12, L)."""
    nb = x.shape[0]
    sub = f32(x).reshape(nb * 8, 32)
    sum_x2 = seq_sum(sub * sub)
    av_x = np.sqrt(sum_x2 / F32(32))
    weights = av_x[:, None] + np.abs(sub)
    scales, mins, L = make_qkx2_quants(sub, weights, nmax, rmin, 0.1, nstep)
    scales = scales.reshape(nb, 8)
    mins = mins.reshape(nb, 8)
    L = L.reshape(nb, 256).astype(np.int32)
    max_scale = np.fmax.reduce(scales, axis=1, initial=F32(0)).astype(F32)
    max_min = np.fmax.reduce(mins, axis=1, initial=F32(0)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
        ls = np.minimum(nearest_int(inv_scale[:, None] * scales) & 0xFF, 63)
        lm = np.minimum(nearest_int(inv_min[:, None] * mins) & 0xFF, 63)
        packed = pack_scale_min_k4(ls, lm)
        d_bits = half_bits(max_scale / F32(63))
        dmin_bits = half_bits(max_min / F32(63))
        sc, m = unpack_scale_min_k4(packed)
        d = from_half_bits(d_bits)[:, None] * sc.astype(F32)  # (nb, 8)
        dm = from_half_bits(dmin_bits)[:, None] * m.astype(F32)
        xs = f32(x).reshape(nb, 8, 32)
        l = np.clip(nearest_int((xs + dm[:, :, None]) / d[:, :, None]), 0, nmax)
    keep = (d == 0)[:, :, None]
    L = np.where(keep, L.reshape(nb, 8, 32), l).reshape(nb, 256)
    return d_bits, dmin_bits, packed, L


def _header(nb, d_bits, dmin_bits, packed, nbytes):
    out = np.zeros((nb, nbytes), np.uint8)
    out[:, 0:2] = d_bits.astype("<u2").view(np.uint8).reshape(nb, 2)
    out[:, 2:4] = dmin_bits.astype("<u2").view(np.uint8).reshape(nb, 2)
    out[:, 4:16] = packed
    return out


def _pack_nibbles_k(L: np.ndarray) -> np.ndarray:
    c = L.reshape(-1, 4, 2, 32).astype(np.uint8)
    return (c[:, :, 0, :] | (c[:, :, 1, :] << 4)).reshape(-1, 128)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    d_bits, dmin_bits, packed, L = _quantize_k(x, 15, -1.0, 20)
    out = _header(x.shape[0], d_bits, dmin_bits, packed, 144)
    out[:, 16:144] = _pack_nibbles_k(L)
    return out


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    d_bits, dmin_bits, packed, L = _quantize_k(x, 31, -0.5, 15)
    out = _header(x.shape[0], d_bits, dmin_bits, packed, 176)
    hi = (L >> 4).reshape(-1, 8, 32).astype(np.uint8)  # sub-block j → bit j of qh[l]
    out[:, 16:48] = np.bitwise_or.reduce(hi << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    out[:, 48:176] = _pack_nibbles_k(L & 0xF)
    return out


# ---------------------------------------------------------------------------------------------------
# Q6_K

def _q6_values(blocks: np.ndarray) -> np.ndarray:
    """(n, 210) → (n, 256) signed 6-bit values −32..31 in weight order."""
    ql = blocks[:, 0:128].reshape(-1, 2, 64)
    qh = blocks[:, 128:192].reshape(-1, 2, 32)
    a, b = ql[:, :, :32], ql[:, :, 32:]
    q1 = (a & 0xF) | (((qh >> 0) & 3) << 4)
    q2 = (b & 0xF) | (((qh >> 2) & 3) << 4)
    q3 = (a >> 4) | (((qh >> 4) & 3) << 4)
    q4 = (b >> 4) | (((qh >> 6) & 3) << 4)
    return np.stack([q1, q2, q3, q4], axis=2).reshape(-1, 256).astype(np.int32) - 32


def dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    d = _half(blocks, 208)[:, None]
    sc = blocks[:, 192:208].view(np.int8).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.repeat(d * sc, 16, axis=1) * _q6_values(blocks).astype(F32)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    sub = f32(x).reshape(nb * 16, 16)
    scales, L = make_qx_quants_rmse1(sub, 32)
    scales = scales.reshape(nb, 16)
    L = L.reshape(nb, 16, 16)
    max_abs = np.zeros(nb, F32)
    max_scale = np.zeros(nb, F32)
    for ib in range(16):
        a = np.abs(scales[:, ib])
        gt = a > max_abs
        max_abs = np.where(gt, a, max_abs)
        max_scale = np.where(gt, scales[:, ib], max_scale)
    zero = max_abs < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-128) / max_scale
        d_bits = half_bits(F32(1) / iscale)
        sc = np.minimum(nearest_int(iscale[:, None] * scales), 127).astype(np.int8)
        d = from_half_bits(d_bits)[:, None] * sc.astype(F32)
        l = np.clip(nearest_int(f32(x).reshape(nb, 16, 16) / d[:, :, None]), -32, 31) + 32
    L = np.where((d == 0)[:, :, None], L, l).reshape(nb, 2, 4, 32).astype(np.uint8)
    out = np.zeros((nb, 210), np.uint8)
    ql = np.concatenate([L[:, :, 0] & 0xF | (L[:, :, 2] & 0xF) << 4,
                         L[:, :, 1] & 0xF | (L[:, :, 3] & 0xF) << 4], axis=2)  # (nb, 2, 64)
    qh = (L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4) | ((L[:, :, 3] >> 4) << 6)
    out[:, 0:128] = ql.reshape(nb, 128)
    out[:, 128:192] = qh.reshape(nb, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d_bits.astype("<u2").view(np.uint8).reshape(nb, 2)
    out[zero] = 0
    return out


# ---------------------------------------------------------------------------------------------------
# Q8_0 and Q8_1

def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    d = _half(blocks, 0)[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        return d * blocks[:, 2:34].view(np.int8).astype(F32)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    x = f32(x)
    amax = np.max(np.abs(x), axis=1)
    d = amax / F32(127)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, F32(1) / d, F32(0))
    q = roundf(x * idv[:, None]).astype(np.int8)
    out = np.empty((x.shape[0], 34), np.uint8)
    out[:, 0:2] = half_bits(d).astype("<u2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out


def dequantize_q8_1(blocks: np.ndarray) -> np.ndarray:
    d = _half(blocks, 0)[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        return d * blocks[:, 4:36].view(np.int8).astype(F32)


Q8_1_S_MODES = ("sum_x", "d_sum_q")


def q8_1_mmq_layout(blocks: np.ndarray) -> np.ndarray:
    """Q8_1 blocks (N, 36) (s_mode "sum_x") → the int8 MMQ's activation layout, what quantize_q8_1_mmq
    writes: the N·32 int8 q, then per block float32 (d, d·Σq) with d·Σq rounded once in fp32."""
    b = np.asarray(blocks, np.uint8).reshape(-1, 36)
    q = b[:, 4:36].view(np.int8)
    d = _half(b, 0).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        ds = np.stack([d, d * q.astype(np.int32).sum(axis=1).astype(F32)], axis=1).astype(F32)
    return np.concatenate([q.reshape(-1).view(np.uint8), ds.reshape(-1).view(np.uint8)])


def quantize_q8_1(x: np.ndarray, s_mode: str = "sum_x") -> np.ndarray:
    """fp32 → Q8_1 blocks.

    s_mode="sum_x" (what ptxgen's kernels produce and consume, like llama.cpp's CUDA quantizer):
      d = amax/127, q = rint(x·(127/amax)) (ties to even, what `cvt.rni` does), s = Σx summed by a
      32-lane xor butterfly; d and s stored as fp16.
    s_mode="d_sum_q" (ggml's CPU `quantize_row_q8_1_ref`): q = roundf(x/d), s = fp16(d·Σq).
    """
    if s_mode not in Q8_1_S_MODES:
        raise ValueError(f"q8_1: s_mode must be one of {Q8_1_S_MODES}, got {s_mode!r}")
    x = f32(x)
    amax = np.max(np.abs(x), axis=1)  # NaN anywhere → NaN (the kernel's max.NaN)
    d = amax / F32(127)
    if s_mode == "sum_x":
        with np.errstate(divide="ignore"):
            idv = np.where(amax > 0, F32(127) / amax, F32(0))
        with np.errstate(invalid="ignore"):
            t = x * idv[:, None]
        q = np.where(np.isnan(t), 0, np.rint(t)).astype(np.int8)  # cvt.rni.s32 of NaN is 0
        s = xor_tree_sum(x)
    else:
        with np.errstate(divide="ignore"):
            idv = np.where(d != 0, F32(1) / d, F32(0))
        q = roundf(x * idv[:, None]).astype(np.int8)
        s = F32(1) * q.astype(np.int32).sum(axis=1).astype(F32) * d
    db, sb = half_bits(d), half_bits(s)
    if s_mode == "sum_x":  # a NaN is stored as 0x7FFF, what the GPU's cvt.rn.f16.f32 writes
        db = np.where(np.isnan(d), np.uint16(0x7FFF), db)
        sb = np.where(np.isnan(s), np.uint16(0x7FFF), sb)
    out = np.empty((x.shape[0], 36), np.uint8)
    out[:, 0:2] = db.astype("<u2").view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = sb.astype("<u2").view(np.uint8).reshape(-1, 2)
    out[:, 4:] = q.view(np.uint8)
    return out


FORMATS = {
    "q4_K": QuantFormat("q4_K", QK_K, 144, Q4_K_DTYPE, 4, dequantize_q4_k, quantize_q4_k),
    "q5_K": QuantFormat("q5_K", QK_K, 176, Q5_K_DTYPE, 4, dequantize_q5_k, quantize_q5_k),
    "q6_K": QuantFormat("q6_K", QK_K, 210, Q6_K_DTYPE, 2, dequantize_q6_k, quantize_q6_k),
    "q8_0": QuantFormat("q8_0", 32, 34, Q8_0_DTYPE, 2, dequantize_q8_0, quantize_q8_0),
    "q8_1": QuantFormat("q8_1", 32, 36, Q8_1_DTYPE, 4, dequantize_q8_1, quantize_q8_1, activation=True),
}
