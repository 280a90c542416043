"""L0: the NumPy format references against ggml's own output and the independent `gguf` package."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

gq = pytest.importorskip("gguf.quants")  # a test dependency (pip install -e ".[dev]"), absent on bare GPU images
GT = gq.GGMLQuantizationType

from ptxgen import formats as F
from ptxgen.formats import ggml
from ptxgen.testing import strategies as S

GGUF_TYPES = {"q4_K": GT.Q4_K, "q5_K": GT.Q5_K, "q6_K": GT.Q6_K, "q8_0": GT.Q8_0}
# ‖x − deq‖/‖x‖ that ggml itself reaches on ../shared/testdata/ggml-ref/x.f32 (its README)
GGML_REL_ERR = {"q4_K": 0.07187, "q5_K": 0.03618, "q6_K": 0.01800, "q8_0": 0.00543}


def test_format_table():
    for name, bpw, nbytes in [("q4_K", 4.5, 144), ("q5_K", 5.5, 176), ("q6_K", 6.5625, 210),
                              ("q8_0", 8.5, 34), ("q8_1", 9.0, 36), ("tq4_1s", 5.0, 20)]:
        f = F.get(name)
        assert f.block_bytes == nbytes == f.dtype.itemsize
        assert f.bits_per_weight == bpw
    with pytest.raises(ValueError, match="known: q4_K"):
        F.get("q4_k_m")


@pytest.mark.parametrize("name", ["q4_K", "q5_K", "q6_K", "q8_0"])
def test_quantize_matches_ggml_reference_bytes(name, ggml_ref):
    x = np.fromfile(ggml_ref / "x.f32", dtype=np.float32).reshape(64, 256)
    want = np.fromfile(ggml_ref / f"{name}.bin", dtype=np.uint8)
    got = F.quantize(name, x)
    f = F.get(name)
    same = (got.reshape(-1, f.block_bytes) == want.reshape(-1, f.block_bytes)).all(axis=1)
    assert same.all(), f"{name}: {np.count_nonzero(~same)} of {same.size} blocks differ from ggml"
    deq = F.dequantize(name, got, x.shape)
    np.testing.assert_array_equal(deq, np.fromfile(ggml_ref / f"{name}.deq", dtype=np.float32).reshape(x.shape))
    rel = np.linalg.norm(x - deq) / np.linalg.norm(x)
    assert abs(rel - GGML_REL_ERR[name]) <= 0.005 * GGML_REL_ERR[name] + 1e-5


def test_q8_1_cpu_meaning_matches_ggml(ggml_ref):
    x = np.fromfile(ggml_ref / "x.f32", dtype=np.float32).reshape(64, 256)
    want = np.fromfile(ggml_ref / "q8_1.bin", dtype=np.uint8)
    np.testing.assert_array_equal(F.quantize("q8_1", x, s_mode="d_sum_q").reshape(-1), want)


def test_q8_1_kernel_meaning():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    raw = F.quantize("q8_1", x)  # default: s = Σx, what the kernels use
    rec = F.get("q8_1").fields(raw, x.shape)
    blocks = x.reshape(-1, 32).astype(np.float64)
    np.testing.assert_allclose(rec["s"].astype(np.float64), blocks.sum(1), rtol=2e-3, atol=1e-3)
    amax = np.abs(blocks).max(1)
    np.testing.assert_allclose(rec["d"].astype(np.float64), amax / 127, rtol=1e-3)
    assert np.abs(rec["qs"]).max() == 127
    with pytest.raises(ValueError, match="s_mode"):
        F.quantize("q8_1", x, s_mode="sum")


@pytest.mark.parametrize("name", list(GGUF_TYPES))
@given(data=st.data())
def test_dequantize_matches_gguf_on_any_bytes(name, data):
    nb = data.draw(S.block_counts(6))
    raw = data.draw(S.raw_blocks(name, nb, finite=data.draw(st.booleans())))
    f = F.get(name)
    got = F.dequantize(name, raw, (nb * f.block_size,))
    with np.errstate(all="ignore"):
        want = gq.dequantize(raw.reshape(-1), GGUF_TYPES[name]).reshape(-1)
    # NaN where gguf has NaN (inf·0, NaN scales), identical bits everywhere else
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(got)
    np.testing.assert_array_equal(got[fin].view(np.uint32), want[fin].view(np.uint32))


def test_nonfinite_scales_propagate_as_ieee():
    f = F.get("q8_0")
    raw = np.zeros((2, 34), np.uint8)
    raw[0, 0:2] = np.array([np.inf], "<f2").view(np.uint8)
    raw[0, 2] = 1  # q = 1 → +inf; q = 0 → inf·0 = NaN
    raw[1, 0:2] = np.array([np.nan], "<f2").view(np.uint8)
    out = f.dequantize(raw, (64,))
    assert out[0] == np.inf and np.isnan(out[1]) and np.isnan(out[32:]).all()


@given(data=st.data())
def test_q8_0_quantize_matches_gguf(data):
    x = data.draw(S.float_blocks(32))
    np.testing.assert_array_equal(F.quantize("q8_0", x).reshape(-1),
                                  gq.quantize(x, GT.Q8_0).reshape(-1))


@pytest.mark.parametrize("name", F.NAMES)
@given(data=st.data())
def test_raw_fields_raw_round_trip(name, data):
    f = F.get(name)
    nb = data.draw(S.block_counts(4))
    raw = data.draw(S.raw_blocks(name, nb, finite=False))
    rec = f.fields(raw, (nb * f.block_size,))
    assert rec.shape == (nb,)
    np.testing.assert_array_equal(np.frombuffer(rec.tobytes(), np.uint8), raw.reshape(-1))


@given(st.lists(st.integers(0, 63), min_size=16, max_size=16))
def test_scale_min_k4_pack_unpack(vals):
    ls = np.array(vals[:8], np.uint8)[None]
    lm = np.array(vals[8:], np.uint8)[None]
    sc, m = ggml.unpack_scale_min_k4(ggml.pack_scale_min_k4(ls, lm))
    np.testing.assert_array_equal(sc, ls)
    np.testing.assert_array_equal(m, lm)


# bound on ‖x − deq(q(x))‖/‖x‖ for one Gaussian row: ggml's average is ~0.072, 0.036, 0.018, 0.0054, 0.0054
# (~0.075 for TQ4_1S); the worst of 300 single rows here was 0.081, 0.041, 0.025, 0.0063, 0.0063, 0.080
ROUNDTRIP_BOUND = {"q4_K": 0.11, "q5_K": 0.055, "q6_K": 0.034, "q8_0": 0.0085, "q8_1": 0.0085, "tq4_1s": 0.11}


@pytest.mark.parametrize("name", F.NAMES)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4), scale=st.sampled_from([1e-3, 1.0, 100.0]))
def test_quantize_dequantize_error_bounded(name, seed, rows, scale):
    f = F.get(name)
    x = (np.random.default_rng(seed).standard_normal((rows, 2 * max(f.block_size, 128))) * scale).astype(np.float32)
    deq = F.dequantize(name, F.quantize(name, x), x.shape)
    rel = np.linalg.norm(x - deq) / np.linalg.norm(x)
    assert rel < ROUNDTRIP_BOUND[name]


@pytest.mark.parametrize("name", F.NAMES)
@given(data=st.data())
def test_quantizers_are_total(name, data):
    """Zero, tiny, constant and huge blocks quantize to finite bytes that dequantize to finite floats."""
    f = F.get(name)
    x = data.draw(S.float_blocks(f.block_size, 3))
    deq = F.dequantize(name, F.quantize(name, x), x.shape)
    assert np.isfinite(deq).all()
    if not np.any(x):
        assert not np.any(deq)


def test_bad_input_messages():
    f = F.get("q4_K")
    with pytest.raises(ValueError, match=r"q4_K: K=100 is not a positive multiple of the block size 256"):
        F.dequantize("q4_K", np.zeros(144, np.uint8), (1, 100))
    with pytest.raises(ValueError, match=r"needs 288 bytes .* got 287"):
        F.dequantize("q4_K", np.zeros(287, np.uint8), (1, 512))
    with pytest.raises(TypeError, match=r"q4_K: raw must have dtype uint8, got int8"):
        F.dequantize("q4_K", np.zeros(144, np.int8), (1, 256))
    with pytest.raises(TypeError, match=r"q8_0: quantize takes float32, got float64"):
        F.quantize("q8_0", np.zeros((1, 32)))
    with pytest.raises(ValueError, match=r"tq4_1s: K=48"):
        F.quantize("tq4_1s", np.zeros((1, 48), np.float32))
    assert f.row_bytes(512) == 288
    assert F.dequantize("q4_K", bytes(288), (1, 512)).shape == (1, 512)


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_weight_quantizers_refuse_non_finite_values_naming_the_row(fmt, bad):
    """A NaN / inf weight would be quantized into plausible garbage (differently per format): refused, with the
    row and column of the first one; allow_nonfinite=True quantizes anyway. Q8_1 (activations) passes them."""
    k = F.get(fmt).block_size * 2
    w = np.random.default_rng(0).standard_normal((5, k)).astype(np.float32)
    w[3, 7] = bad
    with pytest.raises(ValueError, match=r"1 non-finite value\(s\), the first .* at row 3, column 7"):
        F.quantize(fmt, w)
    with pytest.raises(ValueError, match="row 3, column 7"):
        from ptxgen.runtime import QuantTensor

        QuantTensor.from_numpy(w, fmt)
    assert F.quantize(fmt, w, allow_nonfinite=True).shape[0] == 5
    x = np.ones((1, 64), np.float32)
    x[0, 1] = bad
    F.quantize("q8_1", x)  # activations: NaN / inf flow through, as in the kernels
