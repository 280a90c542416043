"""TQ4_1S (TurboQuant, 20 B per 32 weights): the randomized Hadamard transform, the Lloyd-Max codebook,
and bit-exact quantize/dequantize as specified in `../shared/specs/TQ4_1S.md`.
"""
from __future__ import annotations

import numpy as np

from ._f32 import F32, f32, from_half_bits, half_bits
from .base import QuantFormat

QK_TQ4_1S = 32
TQ4_1S_DTYPE = np.dtype([("d0", "<f2"), ("d1", "<f2"), ("qs", "u1", (16,))])

CODEBOOK = np.array(
    [-2.732590, -2.069017, -1.618046, -1.256231, -0.942340, -0.656759, -0.388048, -0.128395,
     0.128395, 0.388048, 0.656759, 0.942340, 1.256231, 1.618046, 2.069017, 2.732590], dtype=F32)
THRESHOLDS = np.array(
    [-2.400804, -1.843532, -1.437139, -1.099286, -0.799550, -0.522404, -0.258222, 0.000000,
     0.258222, 0.522404, 0.799550, 1.099286, 1.437139, 1.843532, 2.400804], dtype=F32)
# the "fast" GEMV's int8 codebook (the fork's dp4a path): round(C·127/2.733), rescaled by 2.733/127 at the end
CODEBOOK_S8 = np.array([-127, -96, -75, -58, -44, -31, -18, -6, 6, 18, 31, 44, 58, 75, 96, 127], np.int8)
FAST_RESCALE = np.float32(2.733) / np.float32(127.0)
SIGN_MASK = 0x696B4B4A  # bit i set where the sign of element i is −1
SIGNS = np.where((SIGN_MASK >> np.arange(32)) & 1, F32(-1), F32(1)).astype(F32)
INV_SQRT32 = F32(0.17677669529663688)
GRID = np.array([0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5], dtype=F32)
REFITS = 6
TINY = F32(1e-10)


def butterfly(v: np.ndarray) -> np.ndarray:
    """Unnormalised Sylvester-Hadamard butterfly over the last axis (32), steps 1, 2, 4, 8, 16."""
    v = f32(v).copy()
    lead = v.shape[:-1]
    for step in (1, 2, 4, 8, 16):
        w = v.reshape(*lead, 32 // (2 * step), 2, step)
        a, b = w[..., 0, :], w[..., 1, :]
        v = np.stack([a + b, a - b], axis=-2).reshape(*lead, 32)
    return v


def rht_forward(x: np.ndarray) -> np.ndarray:
    """y = (1/√32)·H·S·x per 32-element block of the last axis (sign, butterfly, scale)."""
    x = f32(x)
    if x.shape[-1] % QK_TQ4_1S:
        raise ValueError(f"tq4_1s: last dimension {x.shape[-1]} is not a multiple of {QK_TQ4_1S}")
    b = x.reshape(*x.shape[:-1], -1, 32)
    return (butterfly(b * SIGNS) * INV_SQRT32).reshape(x.shape)


def rht_inverse(y: np.ndarray) -> np.ndarray:
    """x = S·(1/√32)·H·y per block (butterfly, then one multiply by ±1/√32)."""
    y = f32(y)
    if y.shape[-1] % QK_TQ4_1S:
        raise ValueError(f"tq4_1s: last dimension {y.shape[-1]} is not a multiple of {QK_TQ4_1S}")
    b = y.reshape(*y.shape[:-1], -1, 32)
    return (butterfly(b) * (INV_SQRT32 * SIGNS)).reshape(y.shape)


def choose_index(v: np.ndarray) -> np.ndarray:
    """Number of thresholds ≤ v (strict `<` puts ties in the upper cell); NaN → 15."""
    v = f32(v)
    idx = np.zeros(v.shape, np.int32)
    for t in THRESHOLDS:
        idx += ~(v < t)
    return idx


def _inv(d):
    with np.errstate(divide="ignore"):
        return np.where(d > TINY, F32(1) / d, F32(0)).astype(F32)


def _seq(terms):  # sequential float32 sum over the last axis
    acc = np.zeros(terms.shape[:-1], F32)
    for j in range(terms.shape[-1]):
        acc = acc + terms[..., j]
    return acc


def quantize_blocks(x: np.ndarray) -> np.ndarray:
    """(n, 32) float32 → (n, 20) uint8, `quantize_row_tq4_1s_ref` step by step."""
    buf = rht_forward(f32(x)).reshape(-1, 2, 16)
    with np.errstate(over="ignore", invalid="ignore"):
        rms = np.sqrt(_seq(buf * buf) / F32(16))  # (n, 2)
        best = rms.copy()
        best_err = np.full(buf.shape[0], F32(1e30))
        for m in GRID:
            d = rms * m
            idx = choose_index(buf * _inv(d)[:, :, None])
            diff = buf - CODEBOOK[idx] * d[:, :, None]
            err = _seq((diff * diff).reshape(-1, 32))
            take = err < best_err
            best_err = np.where(take, err, best_err)
            best = np.where(take[:, None], d, best)
        for _ in range(REFITS):
            c = CODEBOOK[choose_index(buf * _inv(best)[:, :, None])]
            num = _seq(buf * c)
            den = _seq(c * c)
            best = np.where(den > TINY, num / den, best).astype(F32)
        idx = choose_index(buf * _inv(best)[:, :, None]).reshape(-1, 32).astype(np.uint8)
    out = np.empty((buf.shape[0], 20), np.uint8)
    out[:, 0:4] = half_bits(best).astype("<u2").view(np.uint8).reshape(-1, 4)
    out[:, 4:20] = idx[:, 0::2] | (idx[:, 1::2] << 4)
    return out


def indices(blocks: np.ndarray) -> np.ndarray:
    """(n, 20) → (n, 32) codebook indices; element j is the low nibble of qs[j/2] when j is even."""
    qs = blocks[:, 4:20]
    return np.stack([qs & 0xF, qs >> 4], axis=2).reshape(-1, 32)


def half_scales(blocks: np.ndarray) -> np.ndarray:
    """(n, 20) → (n, 32) float32 per-element scale (d0 for 0..15, d1 for 16..31)."""
    d = from_half_bits(blocks[:, 0:4].copy().view("<u2"))
    return np.repeat(d, 16, axis=1)


def rotated_values(blocks: np.ndarray) -> np.ndarray:
    """C[idx]·d: the weights in the rotated domain (before the inverse transform)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return CODEBOOK[indices(blocks)] * half_scales(blocks)


def dequantize_blocks(blocks: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return rht_inverse(rotated_values(blocks))


FORMAT = QuantFormat("tq4_1s", QK_TQ4_1S, 20, TQ4_1S_DTYPE, 2, dequantize_blocks, quantize_blocks)


# --- the decode GEMV's activation layouts ("lanes"): lane l of a warp owns block 32g + l of every row, so
# the rotated activation is stored per group of 32 blocks with element e of block 32g + l at
# [g][e // 4][l][e % 4] (fp32: 4096 bytes per group), or, quantized to Q8_1, the 8 qs words w of block
# 32g + l at [g][w // 4][l][w % 4] followed by the 32 blocks' d as fp32 (d is the Q8_1 fp16 d widened), then
# their Σq as fp32 (exact integers: the min terms of the K-quant lanes; 1280 bytes per group). A warp's
# 16-byte loads are then contiguous across lanes.

LANE_GROUP_F32 = 4096
LANE_GROUP_Q8 = 1280
LANE_SUMS = 1152  # the byte of a quantized group where its blocks' Σq start


def lane_groups(k: int) -> int:
    return -(-(k // QK_TQ4_1S) // 32)


def to_lanes_f32(a: np.ndarray) -> np.ndarray:
    """fp32 (T, K) → the lane layout, (T, groups·1024) fp32; padding blocks are zero."""
    a = f32(a)
    t, k = a.shape
    g = lane_groups(k)
    blocks = np.zeros((t, g * 32, 32), F32)
    blocks[:, : k // 32] = a.reshape(t, k // 32, 32)
    return blocks.reshape(t, g, 32, 8, 4).transpose(0, 1, 3, 2, 4).reshape(t, g * 1024).copy()


def to_lanes_q8(q8_1: np.ndarray, k: int) -> np.ndarray:
    """Q8_1 blocks (T, K/32·36) → the quantized lane layout, (T, groups·LANE_GROUP_Q8) bytes."""
    q = np.asarray(q8_1, np.uint8)
    t = q.shape[0]
    nb, g = k // 32, lane_groups(k)
    blk = np.zeros((t, g * 32, 36), np.uint8)
    blk[:, :nb] = q.reshape(t, nb, 36)
    words = blk[:, :, 4:].copy().view(np.uint32).reshape(t, g, 32, 2, 4)  # [t, g, lane, w // 4, w % 4]
    d = blk[:, :, 0:2].copy().view("<f2").astype(F32).reshape(t, g, 32)
    sums = blk[:, :, 4:].view(np.int8).astype(np.int32).sum(axis=2).astype(F32).reshape(t, g, 32)
    out = np.empty((t, g, LANE_GROUP_Q8), np.uint8)
    out[:, :, :1024] = words.transpose(0, 1, 3, 2, 4).copy().view(np.uint8).reshape(t, g, 1024)
    out[:, :, 1024:LANE_SUMS] = d.view(np.uint8).reshape(t, g, 128)
    out[:, :, LANE_SUMS:] = sums.view(np.uint8).reshape(t, g, 128)
    return out.reshape(t, g * LANE_GROUP_Q8)


# --- the tensor-core decode GEMV's activation layout ("mma tiles"): the rotated activation of up to 8 tokens,
# per 32-block j and token n scaled by 2^s (s = 14 − floor(log2 max|x|), clamped to ±100: the block's largest
# value lands in [2^14, 2^15)) and split into fp16 hi + lo (hi = fp16(x·2^s), lo = fp16(x·2^s − hi); lo = 0
# where hi is not finite), stored as mma.sync m16n8k16 B fragments: half-block hb = 2j + h is 512 bytes, lane
# 4n + t holds elements 16h + 4t .. 16h + 4t + 3 of token n as [hi × 4, lo × 4] (fp16). With the weights'
# A fragments built from qs bytes 2t (k-pair t) and 2t + 1 (k-pair t + 4) of the half, this is the K order
# the MMA needs. The factors 2^-s are fp32 [block][8 tokens]; tokens past T are zeros (factor 2^-100).

MMA_TOKENS = 8
MMA_TILE = 512


# the rotated records' scale (order "rot16"): from the unrotated super-block's max|x| less this many bits — a rotated
# value is at most √32·max|x| (each is a ±1/√32 combination of 32 elements), and max|x|·2^s < 2^13 with s = 14 − 2
# − floor(log2 max|x|), so its hi part stays below √32·2^13 ≈ 46341 < 65504; the scale needs no rotated value (a warp
# rotates its own block only). (s clamps at −100: a super-block past 2^111 would overflow, as any record past 2^115.)
ROT_HEADROOM = 2


def mma_scale_exponent(a: np.ndarray, group: int = 1, headroom: int = 0) -> np.ndarray:
    """s per (token, block) of a (T, K) rotated activation: 14 − floor(log2 max|x|) − headroom from the fp32
    exponent bits (a zero or subnormal max counts as exponent 0; NaN above all), clamped to [-100, 100]. `group` >
    1: the max over each run of `group` blocks (Q4_K: 8, a super-block), the same s for all of them."""
    a = f32(a)
    t, k = a.shape
    bits = (a.view(np.uint32) & np.uint32(0x7FFFFFFF)).reshape(t, k // 32 // group, 32 * group).max(axis=2)
    e = np.repeat(((bits >> 23) & 0xFF).astype(np.int64), group, axis=1)
    return np.clip(141 - headroom - e, -100, 100)


def _mma_scaled(a: np.ndarray, group: int = 1, tokens: int = MMA_TOKENS,
                rotate: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(x·2^s as (tokens, K/32, 32) fp32, s as (tokens, K/32)) for up to `tokens` tokens; tokens past T are zeros
    (s = 100). `rotate`: rht_forward(x)·2^s, s from the unrotated x less ROT_HEADROOM."""
    a = f32(a)
    t, k = a.shape
    if t > tokens:
        raise ValueError(f"to_mma_tiles: at most {tokens} tokens, got {t}")
    nb = k // 32
    full = np.zeros((tokens, k), F32)
    full[:t] = rht_forward(a) if rotate else a
    s = np.full((tokens, nb), 100, np.int64)
    s[:t] = mma_scale_exponent(a, group, ROT_HEADROOM if rotate else 0)
    scale = ((s + 127) << 23).astype(np.uint32).view(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        return (full.reshape(tokens, nb, 32) * scale[:, :, None]).astype(F32), s


def _f16_hi_lo(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp32 → (hi, lo) fp16 with hi = fp16(v), lo = fp16(v − hi); lo = 0 where hi is not finite."""
    with np.errstate(invalid="ignore", over="ignore"):
        hi = v.astype(np.float16)
        return hi, np.where(np.isfinite(hi), (v - hi.astype(F32)).astype(np.float16), np.float16(0))


def to_mma_tiles(a: np.ndarray, group: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Rotated activation (T ≤ 8, K) fp32 → (tiles: K/16 × 512 bytes, factors: (K/32, 8) fp32). `group`: blocks
    sharing one scale (mma_scale_exponent)."""
    xs, s = _mma_scaled(a, group)
    nb = xs.shape[1]
    hi, lo = _f16_hi_lo(xs)
    # [token n, block j, half h, t, slot] → [j, h, n, t, (hi slots, lo slots)]
    hi5 = hi.reshape(MMA_TOKENS, nb, 2, 4, 4).transpose(1, 2, 0, 3, 4)
    lo5 = lo.reshape(MMA_TOKENS, nb, 2, 4, 4).transpose(1, 2, 0, 3, 4)
    tiles = np.concatenate([hi5, lo5], axis=4)  # (nb, 2, 8, 4, 8) fp16
    factors = ((127 - s) << 23).astype(np.uint32).view(F32).T.copy()  # (nb, 8)
    return tiles.reshape(nb * 2 * MMA_TILE // 2).view(np.uint8).copy(), factors


def mma_block_sums(a: np.ndarray, group: int = 1, tokens: int = MMA_TOKENS, rotate: bool = False) -> np.ndarray:
    """Σ of each scaled 32-block of `to_mma_tiles(a, group)`' input (`rotate`: _mma_scaled's rotated values), (K/32,
    tokens) fp32, in the order of a warp butterfly (lane l adds lane l ^ o for o = 16, 8, 4, 2, 1; lane 0's sum)."""
    return _butterfly_sums(_mma_scaled(a, group, tokens, rotate)[0])


def _butterfly_sums(v: np.ndarray) -> np.ndarray:
    """(tokens, blocks, 32) fp32 → each block's sum in a warp butterfly's order, (blocks, tokens)."""
    lane = np.arange(32)
    with np.errstate(invalid="ignore", over="ignore"):
        for o in (16, 8, 4, 2, 1):
            v = (v + v[:, :, lane ^ o]).astype(F32)
    return v[:, :, 0].T.copy()


Q4K_GROUP = 8  # the Q4_K tensor-core GEMV's activation: one scale per super-block (8 blocks) and token
MIN_FRAG_SHIFT = -6  # block sums (< 2^20 at a scale that puts the max in [2^14, 2^15)) times 2^-6 fit fp16


def mma_min_fragments(a: np.ndarray) -> np.ndarray:
    """The Q4_K tensor-core GEMV's min-term B operand: per super-block sb and token n, the 8 block sums S_j of
    `to_mma_tiles(a, Q4K_GROUP)`' scaled input (butterfly order) times 2^MIN_FRAG_SHIFT, split into fp16 hi + lo
    (lo = 0 where hi is not finite), as one m16n8k16 B fragment: lane 4n + t holds (hi S_2t, hi S_2t+1) and
    (lo S_2t, lo S_2t+1) — k = j for hi, 8 + j for lo, so an A fragment of the row's 8 mins m_j, repeated,
    gives Σ_j m_j·S_j in one MMA. (K/256, 32 lanes, 2 words) as bytes, 256 per super-block."""
    sums = mma_block_sums(a, Q4K_GROUP).T  # (8 tokens, K/32)
    n, nb = sums.shape
    with np.errstate(invalid="ignore", over="ignore"):
        sv = (sums * F32(2.0 ** MIN_FRAG_SHIFT)).astype(F32)
    hi, lo = _f16_hi_lo(sv)
    # [n, sb, t, pair] → [sb, n, t, (hi pair, lo pair)]
    hi4 = hi.reshape(n, nb // 8, 4, 2).transpose(1, 0, 2, 3)
    lo4 = lo.reshape(n, nb // 8, 4, 2).transpose(1, 0, 2, 3)
    return np.concatenate([hi4, lo4], axis=3).reshape(-1).view(np.uint8).copy()


Q4K_RECORD_TOKENS = (1, 2, 4, 8)  # the token counts the exact gemv_q4_k_mma_t{nt} are built for
Q4K_HI_TOKENS = 16  # gemv_q4_k_mma_t16h: fp16 hi parts only (one B column per token), up to 16 tokens
Q4K_SKINNY_COLUMNS = 32  # mmq_q4_k_rega_n32: hi-only records of 32 tokens per token group


def q4k_record_columns(nt: int, hi_only: bool = False) -> int:
    """B columns of a q4k_mma_records(·, nt, hi_only) record: 2 per token (hi, lo), or 1 (hi) with hi_only."""
    return nt if hi_only else 2 * nt


def q4k_record_layout(nt: int, hi_only: bool = False) -> tuple[int, int, int]:
    """(min pairs' offset, factors' offset, bytes) of a q4k_mma_records(·, nt, hi_only) record, C =
    q4k_record_columns: 512·C of B pairs, then 16·C of min pairs (hi_only: 32·C, hi and lo of each pair), 4·nt of
    factors, zeros up to a multiple of 16 (exact: 1072, 2128, 4240, 8480 bytes; 16 tokens hi only: 8768)."""
    c = q4k_record_columns(nt, hi_only)
    fac = 512 * c + (32 if hi_only else 16) * c
    return 512 * c, fac, -(-(fac + 4 * nt) // 16) * 16


def q4k_record_bytes(nt: int, hi_only: bool = False) -> int:
    """Bytes per super-block of q4k_mma_records(·, nt, hi_only) (q4k_record_layout)."""
    return q4k_record_layout(nt, hi_only)[2]


# the int8 few-token records (q4k_i8_records): x·2^s·2^I8_SHIFT rounded to an integer (|value| < 2^22 where the
# super-block's max is in [2^14, 2^15) after 2^s) and written as three signed base-256 digits, B columns 3n + p
I8_SHIFT = 7
I8_PLANES = 3


def q4k_i8_record_layout(nt: int) -> tuple[int, int, int]:
    """(min pairs' offset, factors' offset, bytes) of a q4k_i8_records(·, nt) record: 256·C bytes of digit planes
    (C = 3·nt columns), then the min pairs of q4k_mma_records' exact record (32·nt bytes), 4·nt of factors, zeros up
    to a multiple of 16 (816, 1632, 3216, 6432 bytes)."""
    moff = 256 * I8_PLANES * nt
    foff = moff + 32 * nt
    return moff, foff, -(-(foff + 4 * nt) // 16) * 16


def q4k_i8_record_bytes(nt: int) -> int:
    return q4k_i8_record_layout(nt)[2]


def _wrap32(v: np.ndarray) -> np.ndarray:
    return ((v + 2 ** 31) % 2 ** 32) - 2 ** 31


def i8_digits(xs: np.ndarray) -> np.ndarray:
    """The three signed base-256 digits (as bytes, (3,) + xs.shape, least significant first) of
    cvt.rni.s32.f32(xs·2^I8_SHIFT) (NaN → 0, ±inf saturated, as PTX): byte 0 = v & 255, then v ← (v + 128) >> 8
    (arithmetic, in 32 bits): v = d0 + 256·d1 + 65536·d2 with each digit in [-128, 128) for |v| < 2^22."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = xs.astype(np.float64) * 2.0 ** I8_SHIFT
        v = np.where(np.isnan(v), 0, np.clip(np.rint(v), -2 ** 31, 2 ** 31 - 1)).astype(np.int64)
    out = []
    for _ in range(I8_PLANES):
        out.append((v & 0xFF).astype(np.uint8))
        v = _wrap32(v + 128) >> 8
    return np.stack(out)


def q4k_i8_records(a: np.ndarray, nt: int = 1) -> np.ndarray:
    """The activation of the int8 few-token Q4_K GEMVs gemv_q4_k_i8_t{nt} (prep_q4k_i8_t{nt}): x (T ≤ nt, K) fp32 →
    one q4k_i8_record_bytes(nt)-byte record per super-block (offsets q4k_i8_record_layout). Token n's x·2^s (s per
    super-block, as q4k_mma_records) times 2^I8_SHIFT, rounded to an integer (relative error ≤ 2^-22 of the
    super-block's max; s is clamped to ±100 as there, so a super-block whose max is below ~2^-86 keeps fewer bits),
    as three digit planes (i8_digits): plane p in B column c = 3n + p of the m16n8k32 u8 x s8 MMAs. Each MMA takes
    one 32-element sub-block; sub-blocks 2q (the low nibbles of qs bytes 32q .. 32q + 31) and 2q + 1 (the high
    ones) of element k = 16h + 4t + b: byte 64·C·q + 64·c + 16·t + 8·(sub-block & 1) + 4·h + b — lane (g, t)'s B
    registers of both sub-blocks in one 16-byte load. Then the min pairs and factors of the exact
    q4k_mma_records(x, nt) record (the block sums of x·2^s in fp16 hi and lo, 2^-s) — except that a value the
    digits cannot hold (|x·2^s| ≥ 2^15: a super-block whose max is ≥ ~2^115, where the clamped s cannot scale it
    down) counts as +inf in its block's sum, so the outputs of that token are non-finite rather than wrong (as the
    fp16 builds', whose fp16 activation overflows there); zeros after."""
    a = f32(a)
    if nt not in Q4K_RECORD_TOKENS or a.ndim != 2 or not 1 <= a.shape[0] <= nt:
        raise ValueError(f"q4k_i8_records: 1 to {nt} tokens (nt one of {Q4K_RECORD_TOKENS}), got shape {a.shape}")
    xs, s = _mma_scaled(a, Q4K_GROUP, max(nt, MMA_TOKENS))
    nb = xs.shape[1]
    nsb = nb // 8
    ncol = I8_PLANES * nt
    digits = i8_digits(xs[:nt])  # (plane, token, nb, 32) → column c = 3n + p
    cols = digits.transpose(1, 0, 2, 3).reshape(ncol, nsb, 4, 2, 2, 4, 4)  # [c, sb, q, nib, h, t, b]
    main = cols.transpose(1, 2, 0, 5, 3, 4, 6)  # [sb, q, c, t, nib, h, b]
    with np.errstate(invalid="ignore"):
        held = np.where(np.abs(xs) >= F32(2.0 ** (22 - I8_SHIFT)), F32(np.inf), xs)  # (NaN stays NaN)
    sums = _butterfly_sums(held)[:, :nt].T
    with np.errstate(invalid="ignore", over="ignore"):
        shi, slo = _f16_hi_lo((sums * F32(2.0 ** MIN_FRAG_SHIFT)).astype(F32))
    mins = np.stack([shi, slo], axis=1).reshape(2 * nt, nsb, 8).transpose(1, 0, 2)  # q4k_mma_records' [sb, c, 2t + pair]
    exact = q4k_mma_records(a, nt).reshape(nsb, -1)
    emoff, efoff, erb = q4k_record_layout(nt)
    moff, foff, rb = q4k_i8_record_layout(nt)
    rec = np.zeros((nsb, rb), np.uint8)
    rec[:, :moff] = np.ascontiguousarray(main).reshape(nsb, -1)
    rec[:, moff:foff] = np.ascontiguousarray(mins).reshape(nsb, -1).view(np.uint8)
    rec[:, foff:foff + 4 * nt] = exact[:, efoff:efoff + 4 * nt]
    return rec.reshape(-1)


def q6k_i8_record_layout(nt: int) -> tuple[int, int, int]:
    """(sub-block sums' offset, factors' offset, bytes) of a q6k_i8_records(·, nt) record: 256·C bytes of digit
    planes (C = 3·nt columns; q4k_i8_records' bytes), then each column's 16 sub-block sums as fp16 (32·C bytes),
    4·nt of factors, zeros up to a multiple of 16 (880, 1744, 3472, 6944 bytes)."""
    xoff = 256 * I8_PLANES * nt
    foff = xoff + 32 * I8_PLANES * nt
    return xoff, foff, -(-(foff + 4 * nt) // 16) * 16


def q6k_i8_record_bytes(nt: int) -> int:
    return q6k_i8_record_layout(nt)[2]


I8_SUM_NAN, I8_SUM_INF = 0x7E00, 0x7C00  # a sub-block sum's fp16 bits where its values hold a NaN / one too large


def q6k_i8_records(a: np.ndarray, nt: int = 1) -> np.ndarray:
    """The activation of the int8 few-token Q6_K GEMVs gemv_q6_k_i8_t{nt} (prep_q6k_i8_t{nt}): q4k_i8_records'
    digit planes (byte 64·C·q + 64·c + 16·t + 4·i + b: element 4t + b of 16-element sub-block 4q + i — lane (g,
    t)'s B registers of m16n8k16 for four sub-blocks in one 16-byte load), then X[c][s], the sum of column c's 16
    digits of sub-block s as fp16 (exact: |X| ≤ 2048) at 32·c + 2·s past the planes — the B of the MMA that takes
    the −32 of Q6_K's q − 32 as Σ_s sc_s·X_s —, then the factors 2^-s. A sub-block holding a NaN (of x·2^s) has X
    = NaN, else one holding a value the digits cannot hold (|x·2^s| ≥ 2^15: an inf, or past ~2^115) X = +inf, in
    every plane: that token's outputs are non-finite (as the fp16 builds' and q4k_i8_records' min sums)."""
    a = f32(a)
    if nt not in Q4K_RECORD_TOKENS or a.ndim != 2 or not 1 <= a.shape[0] <= nt:
        raise ValueError(f"q6k_i8_records: 1 to {nt} tokens (nt one of {Q4K_RECORD_TOKENS}), got shape {a.shape}")
    base = q4k_i8_records(a, nt).reshape(-1, q4k_i8_record_bytes(nt))
    nsb = base.shape[0]
    xs, _ = _mma_scaled(a, Q4K_GROUP, max(nt, MMA_TOKENS))
    xs = xs[:nt].reshape(nt, nsb, 16, 16)  # [token, sb, s, element]
    digits = i8_digits(xs).view(np.int8).astype(np.int64)  # [plane, token, sb, s, element]
    sums = digits.sum(axis=-1).astype(np.float16).view(np.uint16)
    with np.errstate(invalid="ignore"):
        nan = np.isnan(xs).any(axis=-1)
        big = (np.abs(xs) >= F32(2.0 ** (22 - I8_SHIFT))).any(axis=-1)
    sums = np.where(nan, np.uint16(I8_SUM_NAN), np.where(big, np.uint16(I8_SUM_INF), sums))
    cols = sums.transpose(2, 1, 0, 3).reshape(nsb, I8_PLANES * nt, 16)  # [sb, c = 3n + p, s]
    moff, mfoff, _ = q4k_i8_record_layout(nt)
    xoff, foff, rb = q6k_i8_record_layout(nt)
    rec = np.zeros((nsb, rb), np.uint8)
    rec[:, :xoff] = base[:, :moff]
    rec[:, xoff:foff] = np.ascontiguousarray(cols.astype("<u2")).reshape(nsb, -1).view(np.uint8)
    rec[:, foff:foff + 4 * nt] = base[:, mfoff:mfoff + 4 * nt]
    return rec.reshape(-1)


# the K orders of the few-token records (q4k_mma_records' `order`); "rot16": "sub16" of the rotated activation
RECORD_ORDERS = ("q4k", "sub16", "rot16", "i8", "i8q6")


def q4k_mma_records(a: np.ndarray, nt: int = 1, hi_only: bool = False, order: str = "q4k") -> np.ndarray:
    """The activation of the few-token Q4_K tensor-core GEMVs gemv_q4_k_mma_t{nt} (prep_q4k_t{nt}) and, with
    hi_only, gemv_q4_k_mma_t16h (prep_q4k_t16h): x (T ≤ nt, K) fp32 → one q4k_record_bytes(nt, hi_only)-byte
    record per super-block (offsets: q4k_record_layout). Token n's x·2^s (one s per super-block, as
    to_mma_tiles(x, Q4K_GROUP)) split into fp16 hi + lo fills B column c = 2n (hi) and 2n + 1 (lo); with hi_only
    column c = n holds the hi part alone (fp16 activations, as the prefill GEMMs). Tokens past T are zeros
    (factor 2^-100). Lane (g, t) of the GEMV owns sub-blocks 2t (low nibbles) and 2t + 1 (high), and its MMA
    pair i covers elements 4i .. 4i + 3 of both: with C = q4k_record_columns columns, bytes 64·C·i + 16·(4c + t)
    hold, for sub-block 2t then 2t + 1, the pairs (e 4i, e 4i + 2) and (e 4i + 1, e 4i + 3) — the k order of
    the A fragments the nibble masks 0x000F000F / 0x00F000F0 give (bytes 0, 2 and, after a shift by 8, bytes 1,
    3). Min pairs: the scaled block sums (S_2t, S_2t+1) (butterfly order) times 2^MIN_FRAG_SHIFT, as fp16 hi or
    lo in column c's 4 bytes at 4·(4c + t); with hi_only the sums are of the hi parts (the values the main
    product uses: the min term then cancels against the same rounded x, which halves the error) and each lane
    slot holds the hi pair then the lo pair (8 bytes at 8·(4c + t)). Then token n's factor 2^-s (fp32); zeros
    after.

    order="sub16" (prep_sub16_t{nt}, for the codecs' few-token GEMVs gemv_<fmt>_mma_t{nt} of Q6_K and Q8_0, whose
    MMAs each take one 16-element sub-block, lane t its elements 4t .. 4t + 3 — the codec's mma_block order): the
    same record, B pair i holding 32-element block i of the super-block, bytes 64·C·i + 16·(4c + t) + 8·h + 2·q
    element 16h + 4t + q of it (with hi_only, prep_sub16_t16h: column c = n, as above). order="rot16" (prep_rot16_t{nt}, TQ4_1S's few-token GEMVs):
    "sub16" of rht_forward(x), s from the unrotated super-block less ROT_HEADROOM (its min pairs unused).
    order="i8": q4k_i8_records(a, nt) (the int8 builds' digit planes); "i8q6": q6k_i8_records(a, nt) (Q6_K's)."""
    if order in ("i8", "i8q6"):
        if hi_only:
            raise ValueError(f"q4k_mma_records: the int8 records (order {order}) are exact only")
        return q4k_i8_records(a, nt) if order == "i8" else q6k_i8_records(a, nt)
    a = f32(a)
    if order not in RECORD_ORDERS or (hi_only and order not in ("q4k", "sub16")):
        raise ValueError(f"q4k_mma_records: order one of {RECORD_ORDERS} (hi_only: q4k or sub16), got {order!r}")
    tokens = (Q4K_HI_TOKENS, Q4K_SKINNY_COLUMNS) if hi_only else Q4K_RECORD_TOKENS
    if nt not in tokens or a.ndim != 2 or not 1 <= a.shape[0] <= nt:
        raise ValueError(f"q4k_mma_records: 1 to {nt} tokens (nt one of {tokens}), got shape {a.shape}")
    rot = order == "rot16"
    xs, s = _mma_scaled(a, Q4K_GROUP, max(nt, MMA_TOKENS), rot)
    nb = xs.shape[1]
    nsb = nb // 8
    hi, lo = _f16_hi_lo(xs[:nt])
    with np.errstate(invalid="ignore", over="ignore"):
        if hi_only:  # Σ of the hi parts in the butterfly order
            v = hi.astype(F32)
            for o in (16, 8, 4, 2, 1):
                v = (v + v[:, :, np.arange(32) ^ o]).astype(F32)
            sums = v[:, :, 0]
        else:
            sums = mma_block_sums(a, Q4K_GROUP, max(nt, MMA_TOKENS), rot)[:, :nt].T
        sv = (sums * F32(2.0 ** MIN_FRAG_SHIFT)).astype(F32)  # (nt, nb)
    shi, slo = _f16_hi_lo(sv)
    ncol = q4k_record_columns(nt, hi_only)
    cols = hi if hi_only else np.stack([hi, lo], axis=1)
    if order == "q4k":  # [column c, sb, t, nib, i, p >> 1, p & 1] → [sb, i, c, t, nib, p & 1, p >> 1]
        main = cols.reshape(ncol, nsb, 4, 2, 8, 2, 2).transpose(1, 4, 0, 2, 3, 6, 5)
    else:  # [c, sb, i, h, t, q] → [sb, i, c, t, h, q]
        main = cols.reshape(ncol, nsb, 8, 2, 4, 4).transpose(1, 2, 0, 4, 3, 5)
    if hi_only:  # [c, sb, t, pair] x (hi, lo) → [sb, c, t, (hi pair, lo pair)]
        mins = np.stack([shi.reshape(ncol, nsb, 4, 2), slo.reshape(ncol, nsb, 4, 2)], axis=3).transpose(1, 0, 2, 3, 4)
    else:  # [sb, c, j = 2t + pair]
        mins = np.stack([shi, slo], axis=1).reshape(ncol, nsb, 8).transpose(1, 0, 2)
    moff, foff, rb = q4k_record_layout(nt, hi_only)
    rec = np.zeros((nsb, rb), np.uint8)
    rec[:, :moff] = main.reshape(nsb, -1).view(np.uint8)
    rec[:, moff:foff] = np.ascontiguousarray(mins).reshape(nsb, -1).view(np.uint8)
    fac = ((127 - s[:nt, ::8]) << 23).astype(np.uint32).T  # (nsb, nt)
    rec[:, foff:foff + 4 * nt] = np.ascontiguousarray(fac).view(np.uint8)
    return rec.reshape(-1)


def mma_pair_table() -> np.ndarray:
    """The tensor-core GEMV's codebook by qs byte v (256 entries of 8 bytes, before replication per lane): the A
    words of its two elements, (hi(C[v & 15]), hi(C[v >> 4])) and (lo(C[v & 15]), lo(C[v >> 4])) as fp16x2 (the low
    nibble's in the low half), hi and lo as in mma_element_table."""
    c = CODEBOOK.astype(F32)
    hi = c.astype(np.float16)
    lo = (c - hi.astype(F32)).astype(np.float16)
    v = np.arange(256)
    pair = lambda h: h.view(np.uint16)[v & 15].astype(np.uint32) | (h.view(np.uint16)[v >> 4].astype(np.uint32) << 16)  # noqa: E731
    return np.stack([pair(hi), pair(lo)], axis=1).astype("<u4").view(np.uint8).reshape(2048).copy()


def mma_element_table() -> np.ndarray:
    """The tensor-core GEMV's codebook in shared memory: for each index i, one word (hi(C[i]), lo(C[i])) as
    fp16 (hi in the low half), where hi = fp16(C[i]) and lo = fp16(C[i] - hi), repeated for the 32 lanes
    ([index][lane], 2 KB): a lane reads word 32·i + lane, so a warp's lookups never share a bank (the
    256-entry table of byte pairs the first version used had 1.6 bank conflicts per wavefront on the H200)."""
    c = CODEBOOK.astype(F32)
    hi = c.astype(np.float16)
    lo = (c - hi.astype(F32)).astype(np.float16)
    word = hi.view(np.uint16).astype(np.uint32) | (lo.view(np.uint16).astype(np.uint32) << 16)
    return np.repeat(word[:, None], 32, axis=1).astype("<u4").view(np.uint8).reshape(2048).copy()
