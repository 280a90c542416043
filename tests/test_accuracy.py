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
