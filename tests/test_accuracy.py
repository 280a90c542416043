"""ptxgen.testing.accuracy: the tests' error measure against float64, scaled by the products so that one output
whose sum cancels is held to the rounding its terms allow, while a wrong result still fails."""
import numpy as np
import pytest

from ptxgen import formats
from ptxgen.testing.accuracy import gemm_rel_error, mul_mat_id_scale, product_scale, rel_error


@pytest.mark.parametrize("fmt", ["q4_K", "q6_K", "tq4_1s"])
def test_one_output_with_fp16_x_stays_within_the_fp16_bound(fmt):
    """M = T = 1, x rounded to fp16 (what the fp16 GEMMs read): the unscaled measure passes 1e-3 only by luck (a dot
    product near zero), the scaled one holds it for every draw."""
    rng = np.random.default_rng(3)
    unscaled = []
    for _ in range(60):
        raw = formats.quantize(fmt, rng.standard_normal((1, 256)).astype(np.float32))
        x = rng.standard_normal((1, 256)).astype(np.float32)
        x16 = x.astype(np.float16).astype(np.float32)
        ref = formats.gemv_tq4_1s_ref if fmt == "tq4_1s" else lambda *a: formats.gemm_ref(fmt, *a)
        got = ref(raw, 1, 256, formats.rht_inverse(formats.rht_forward(x).astype(np.float16).astype(np.float32))
                  if fmt == "tq4_1s" else x16)
        assert gemm_rel_error(got, fmt, raw, 1, 256, x) <= 1e-3
        unscaled.append(rel_error(got, formats.gemm_ref(fmt, raw, 1, 256, x)))
    assert max(unscaled) > 1e-3  # (why the scale: the plain measure fails some of these correct results)


def test_a_wrong_weight_still_fails():
    """One weight of a row read wrong (its contribution doubled) is far outside 1e-3 of the scaled measure at once,
    with many outputs and with one."""
    rng = np.random.default_rng(4)
    m, k, t = 64, 1024, 16
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = formats.dequantize("q4_K", raw, (m, k)).astype(np.float64)
    j = int(np.argmax(np.abs(w[0] * x[0])))  # the first row's largest term, read wrong in every row
    bad = w.copy()
    bad[:, j] *= 2
    got = x.astype(np.float64) @ bad.T
    assert gemm_rel_error(got, "q4_K", raw, m, k, x) > 1e-2
    assert gemm_rel_error(got[:1, :1], "q4_K", raw[:1], 1, k, x[:1]) > 1e-2


def test_scales_match_the_references_shapes_and_nan_rows():
    rng = np.random.default_rng(5)
    e, m, k, t = 4, 8, 256, 3
    raw = formats.quantize("q4_K", rng.standard_normal((e * m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    ids = np.array([[0, 3], [-1, 2], [1, 4]], np.int32)
    want = formats.mul_mat_id_ref("q4_K", raw, (e, m, k), x, ids)
    s = mul_mat_id_scale("q4_K", raw, (e, m, k), x, ids)
    assert s.shape == want.shape and np.array_equal(np.isnan(s), np.isnan(want))
    assert np.allclose(s[0, 0], product_scale("q4_K", raw[:m], m, k, x[:1])[0])
    assert rel_error(np.zeros(3), np.zeros(3)) == 0.0 and rel_error(np.ones(3), np.zeros(3)) == float("inf")


@pytest.mark.parametrize("fmt", ["q4_K", "q6_K", "q8_0"])
def test_int8_digit_planes_hold_outlier_activations_within_the_exact_bound(fmt):
    """The int8 few-token GEMVs' activation (formats.tq4_1s q4k_i8_records / q6k_i8_records: x·2^s·2^7 rounded to
    three base-256 digits, s one a super-block) keeps x to 2^-22 of its super-block's max, not of each value: an
    LLM's outlier channels (here 6 of them, up to 10^4 x the rest) cost their neighbours precision, yet the product
    through those digits stays within exact mode's 1e-5 of float64 by the tests' scaled measure (its weights at
    the outliers not near zero)."""
    from ptxgen.formats import tq4_1s as T4

    rng = np.random.default_rng(5)
    m, k = 256, 2048
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    for ratio in (1.0, 1e2, 1e4):
        x = rng.standard_normal((1, k)).astype(np.float32)
        x[0, rng.choice(k, 6, replace=False)] *= np.float32(ratio)
        xs, s = T4._mma_scaled(x, T4.Q4K_GROUP, 1)  # as the preps: x·2^s, s a super-block
        d = T4.i8_digits(xs).astype(np.uint8).view(np.int8).astype(np.int64)  # signed digits (planes, 1, K/32, 32)
        v = d[0] + 256 * d[1] + 65536 * d[2]
        held = (v * 2.0 ** -T4.I8_SHIFT * 2.0 ** -s[..., None].astype(np.float64)).reshape(1, k)
        assert np.abs(held - x).max() <= 2.0 ** -22 * np.abs(x).max() * 1.01  # (the planes' grid, as documented)
        err = gemm_rel_error(formats.gemm_ref(fmt, raw, m, k, held), fmt, raw, m, k, x)
        assert err <= 1e-5, (ratio, err)
