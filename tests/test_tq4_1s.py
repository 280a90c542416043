"""L0: TQ4_1S reference properties and the spec's constants."""
from __future__ import annotations

import numpy as np
from hypothesis import given, strategies as st

from ptxgen import formats as F
from ptxgen.formats import tq4_1s as T
from ptxgen.testing import strategies as S


def hadamard32():
    i = np.arange(32)
    pop = np.vectorize(lambda v: bin(v).count("1"))(i[:, None] & i[None, :])
    return np.where(pop % 2, -1.0, 1.0)


def test_constants_from_spec():
    assert T.CODEBOOK.view(np.uint32)[0] == 0xC02EE2C1 and T.CODEBOOK.view(np.uint32)[8] == 0x3E0379FB
    np.testing.assert_array_equal(T.CODEBOOK[::-1], -T.CODEBOOK)
    assert np.float32(T.INV_SQRT32).view(np.uint32) == 0x3E3504F3
    assert (T.SIGNS < 0).sum() == 16 and list(T.SIGNS[:8]) == [1, -1, 1, -1, 1, 1, -1, 1]


def test_rht_is_the_normalised_sylvester_transform():
    x = np.random.default_rng(0).standard_normal((5, 32)).astype(np.float32)
    want = (hadamard32() @ (T.SIGNS.astype(np.float64) * x).T).T / np.sqrt(32)
    np.testing.assert_allclose(F.rht_forward(x), want, rtol=1e-5, atol=1e-5)
    m = F.rht_forward(np.eye(32, dtype=np.float32)).astype(np.float64)
    np.testing.assert_allclose(m @ m.T, np.eye(32), atol=1e-6)  # orthonormal


@given(seed=st.integers(0, 2**32 - 1), nb=st.integers(1, 8))
def test_forward_inverse_identity(seed, nb):
    x = np.random.default_rng(seed).standard_normal((2, 32 * nb)).astype(np.float32)
    np.testing.assert_allclose(F.rht_inverse(F.rht_forward(x)), x, rtol=0, atol=4e-6 * np.abs(x).max())


def test_choose_index_ties_and_nan():
    v = np.array([0.0, -0.0, T.THRESHOLDS[8], np.nextafter(T.THRESHOLDS[8], np.float32(0)), np.nan, -10, 10],
                 np.float32)
    np.testing.assert_array_equal(T.choose_index(v), [8, 8, 9, 8, 15, 0, 15])


def test_upstream_test_vector():
    """Upstream's unit test: make_wave_values(64, 0.25f) quantizes to these 40 bytes."""
    i = np.arange(64, dtype=np.float32)
    a = np.float32(0.25) + np.float32(0.17) * i
    b = np.float32(0.125) + np.float32(0.11) * i
    x = (np.float32(0.75) * np.sin(a.astype(np.float64)).astype(np.float32)
         + np.float32(0.35) * np.cos(b.astype(np.float64)).astype(np.float32)).astype(np.float32)
    want = bytes([27, 57, 47, 60, 153, 105, 211, 227, 122, 122, 153, 56, 152, 152, 196, 4, 121, 185, 168, 169,
                  26, 53, 164, 54, 85, 85, 192, 0, 115, 147, 42, 42, 27, 171, 165, 55, 25, 72, 13, 254])
    assert F.quantize("tq4_1s", x).tobytes() == want


def test_zero_block_encoding():
    raw = F.quantize("tq4_1s", np.zeros((1, 32), np.float32))
    assert raw.tobytes() == bytes(4) + bytes([0x88]) * 16


def test_nibble_order_is_low_first():
    raw = np.zeros((1, 20), np.uint8)
    raw[0, 4] = 0x3A  # element 0 → 0xA, element 1 → 0x3
    np.testing.assert_array_equal(T.indices(raw)[0, :2], [0xA, 0x3])


@given(data=st.data())
def test_fused_gemv_equals_dequantize_then_dot(data):
    m, k = data.draw(S.matrix_shapes("tq4_1s", max_rows=9, max_blocks_per_row=4))
    raw = data.draw(S.raw_matrix("tq4_1s", m, k, max_abs_scale=100.0))
    x = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).standard_normal((3, k)).astype(np.float32)
    fused = F.gemv_tq4_1s_ref(raw, m, k, x)
    plain = F.gemm_ref("tq4_1s", raw, m, k, x)
    scale = np.abs(x).sum() * 2.8 * 100 / np.sqrt(32) + 1e-30
    np.testing.assert_allclose(fused, plain, rtol=0, atol=1e-5 * scale)


@given(data=st.data())
def test_dequantize_is_inverse_rht_of_rotated_values(data):
    raw = data.draw(S.raw_blocks("tq4_1s", data.draw(S.block_counts(5))))
    nb = raw.shape[0]
    deq = F.dequantize("tq4_1s", raw, (nb * 32,))
    with np.errstate(all="ignore"):
        want = np.concatenate([T.rht_inverse(T.rotated_values(raw[i:i + 1])).reshape(-1) for i in range(nb)])
    np.testing.assert_array_equal(deq, want)


def test_quantizer_picks_indices_with_unrounded_scale():
    x = np.random.default_rng(3).standard_normal((64, 32)).astype(np.float32)
    raw = F.quantize("tq4_1s", x)
    rot = F.rht_forward(x).reshape(-1, 2, 16)
    d = raw[:, 0:4].copy().view("<f2").astype(np.float32)
    # re-choosing with the stored (rounded) scale reproduces almost all indices; the spec says the
    # quantizer used the unrounded one, so a few may differ, never by more than one cell
    idx_rounded = T.choose_index(rot / d[:, :, None]).reshape(-1, 32)
    diff = np.abs(idx_rounded - T.indices(raw))
    assert diff.max() <= 1


def test_mma_tiles_hold_the_activation_as_scaled_hi_plus_lo():
    """to_mma_tiles: (hi + lo)·2^-s gives back every value to ~2^-22 of its block's largest, the scaled block
    maximum lies in [2^14, 2^15), tokens past T are zero, and the layout is the B fragment order."""
    from ptxgen.formats import tq4_1s as T4

    rng = np.random.default_rng(7)
    t, k = 3, 256
    a = (rng.standard_normal((t, k)) * np.array([[1e-4], [1.0], [300.0]])).astype(np.float32)
    tiles, f = T4.to_mma_tiles(a)
    v = tiles.view(np.float16).astype(np.float64).reshape(k // 32, 2, 8, 4, 8)  # [block, half, token, t, hi4 lo4]
    rec = (v[..., :4] + v[..., 4:]).transpose(2, 0, 1, 3, 4).reshape(8, k) * np.repeat(f.T, 32, axis=1)
    amax = np.repeat(np.abs(a).reshape(t, k // 32, 32).max(axis=2), 32, axis=1)
    assert np.all(np.abs(rec[:t] - a) <= amax * 2.0 ** -21)
    assert not rec[t:].any()
    scaled_max = np.abs(v[..., :4]).reshape(k // 32, 2, 8, 16).max(axis=(1, 3))[:, :t]
    assert np.all((scaled_max >= 2 ** 14) & (scaled_max <= 2 ** 15))
    assert np.all(np.log2(f) == np.round(np.log2(f)))


def test_mma_pair_table_holds_both_elements_words():
    """The tensor-core GEMV's pair table: for every qs byte v, the (hi, hi) and (lo, lo) fp16x2 A words of its two
    elements — the low nibble's in the low half — equal to the per-element table's halves, and hi + lo within
    2^-22 of the fp32 codebook value."""
    elem = T.mma_element_table().view("<u4").reshape(16, 32)[:, 0]
    pair = T.mma_pair_table().view("<u4").reshape(256, 2)
    v = np.arange(256)
    assert np.array_equal(pair[:, 0], (elem[v & 15] & 0xFFFF) | ((elem[v >> 4] & 0xFFFF) << 16))
    assert np.array_equal(pair[:, 1], (elem[v & 15] >> 16) | ((elem[v >> 4] >> 16) << 16))
    halves = pair.view("<u2").reshape(256, 2, 2).view(np.float16).astype(np.float64)
    got = halves[:, 0, :] + halves[:, 1, :]  # hi + lo of (low nibble, high nibble)
    want = T.CODEBOOK.astype(np.float64)[np.stack([v & 15, v >> 4], axis=1)]
    assert np.abs(got - want).max() <= 2.0 ** -22 * np.abs(want).max()
