"""L3: decode GEMV through mul_mat on the GPU against the float64 references."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ptxgen import codecs, formats, knobs, tuning
from ptxgen.specs import GemvKernel
from ptxgen.testing import strategies as S
from ptxgen.testing.accuracy import product_scale
from conftest import graph_replayed, rel, rel_ref, setknob

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fmt", ["tq4_1s", "q4_K", "q5_K", "q6_K", "q8_0"])
@settings(max_examples=25)
@given(data=st.data())
def test_mul_mat_gemv_matches_reference(fmt, data):
    """mul_mat(mode="exact") at decode T (1-8) and the skinny T past it (9, 17) on quantized weights or drawn raw
    blocks (any bytes; scales up to strategies.fp16_weight_scale, the largest whose weights all fit fp16, as the
    GEMMs some of these calls run hold them): within 1e-5 of float64 through the exact GEMVs, 1e-3 where the plan
    ran an fp16 GEMM; outputs NaN-poisoned first."""
    import ptxgen.runtime as r

    m = data.draw(st.sampled_from([1, 7, 127, 128, 129, 300]))
    k = data.draw(st.sampled_from([256, 512, 768] + ([96, 3584] if fmt == "tq4_1s" else [4096])))
    t = data.draw(st.sampled_from([1, 2, 3, 5, 8, 9, 17]))
    rotation = data.draw(st.sampled_from(["separate", "fused"]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    if data.draw(st.booleans()):
        raw = data.draw(S.raw_matrix(fmt, m, k, max_abs_scale=S.fp16_weight_scale(fmt)))  # any bytes
    else:
        raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    out = r.DeviceArray.empty((t, m), np.float32)
    out.owner.fill_bytes(0xFF)  # NaN poison: unwritten outputs fail
    r.mul_mat(w, x, out=out, rotation=rotation)
    got = out.numpy()
    want = formats.gemv_tq4_1s_ref(raw, m, k, x) if fmt == "tq4_1s" else formats.gemm_ref(fmt, raw, m, k, x)
    assert np.isfinite(got).all()
    # above 8 tokens the plan may run an fp16 GEMM (Q4_K's t16h or MMQ, TQ4_1S's prepared GEMM): the fp16 bound
    fp16 = any("mmq_" in n or "t16h" in n for n in r.mul_mat_plan(w, t, rotation=rotation).kernels)
    assert rel(got, want, product_scale(fmt, raw, m, k, x)) <= (1e-3 if fp16 else 1e-5)  # (M = T = 1: scaled)


@pytest.mark.parametrize("m", [1000, 2100])
def test_fused_and_separate_rotation_agree_and_auto_is_deterministic(m):
    """rotation="fused" (gemv_tq4_1s_t{1,2,4}_fused: the rotation inside the GEMV) is within 2e-6 of "separate"
    (prep_tq4_1s + the TMA or lane GEMV: the same terms summed in another order; found 2026-12-06 on an H100, ~6e-7
    an element, not the bits an earlier text claimed) and gives its bits at 8 tokens (both separate there); "auto"
    — fused below RULES.fused_rotation_max_weights (1000 rows), separate above (2100) — gives the bits of the one it
    picks, run after run, and from an fp16 x those of its fp32 widening."""
    import ptxgen.runtime as r

    rng = np.random.default_rng(2)
    w = r.QuantTensor.from_numpy(rng.standard_normal((m, 3584)).astype(np.float32), "tq4_1s")
    small = m * 3584 < 1 << 22
    for t in (1, 2, 3, 4, 8):
        x = (rng.standard_normal((t, 3584)) * 2).astype(np.float16).astype(np.float32)
        a = r.mul_mat(w, x, rotation="separate")
        b = r.mul_mat(w, x, rotation="fused")
        if t <= 4:
            assert np.isfinite(b).all() and rel(b, a) <= 2e-6, rel(b, a)
        else:
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
        want = b if small and t <= 4 else a
        assert (r.mul_mat_plan(w, t).kernels[-1].endswith("_fused")) == (small and t <= 4)
        for _ in range(3):
            np.testing.assert_array_equal(r.mul_mat(w, x).view(np.uint32), want.view(np.uint32))
        np.testing.assert_array_equal(r.mul_mat(w, x.astype(np.float16)).view(np.uint32), want.view(np.uint32))


def test_rotation_kernel_bit_exact():
    import ptxgen.runtime as r

    x = np.random.default_rng(3).standard_normal((5, 4096)).astype(np.float32)
    np.testing.assert_array_equal(r.rotate_tq4_1s(x).view(np.uint32), formats.rht_forward(x).view(np.uint32))


def test_mul_mat_errors():
    import ptxgen.runtime as r

    w = r.QuantTensor.from_numpy(np.ones((4, 256), np.float32), "q4_K")
    with pytest.raises(ValueError, match=r"x must have shape \(T, 256\)"):
        r.mul_mat(w, np.ones((2, 512), np.float32))
    with pytest.raises(TypeError, match="expected dtype float32 or float16, got float64"):
        r.mul_mat(w, np.ones((2, 256), np.float64))
    with pytest.raises(ValueError, match="rotation must be"):
        r.mul_mat(w, np.ones((2, 256), np.float32), rotation="none")
    w8 = r.QuantTensor.from_numpy(np.ones((4, 96), np.float32), "q8_0")  # K = 96: not the int8 GEMV's, so exact
    np.testing.assert_array_equal(r.mul_mat(w8, np.ones((2, 96), np.float32), mode="fast"),
                                  r.mul_mat(w8, np.ones((2, 96), np.float32)))
    with pytest.raises(ValueError, match="mode must be"):
        r.mul_mat(w, np.ones((2, 256), np.float32), mode="quick")


@pytest.mark.parametrize("t", [1, 3, 8])  # (above 8 tokens fast runs the exact kernels: test_fast_mode_past_8_tokens)
def test_fast_tq4_1s_gemv_kernel(t):
    """mul_mat(mode="fast") up to 8 tokens: rotate, Q8_1, dp4a GEMV with the int8 codebook. Within 1e-5 of the int8
    NumPy model (the kernel's own arithmetic), NMSE against the exact result within the fork's 5e-4."""
    import ptxgen.runtime as r

    rng = np.random.default_rng(t)
    m, k = 300, 3584
    raw = formats.quantize("tq4_1s", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = r.QuantTensor.from_raw("tq4_1s", raw, (m, k))
    out = r.DeviceArray.empty((t, m), np.float32)
    out.owner.fill_bytes(0xFF)  # NaN: unwritten outputs fail
    with tuning.override(fast_lanes_max_tokens=8):  # the lane GEMV at every T it has a build for
        r.mul_mat(w, r.as_device_array(x), out=out, mode="fast")
    got = out.numpy().astype(np.float64)
    model = formats.gemv_tq4_1s_fast_ref(raw, m, k, x)
    exact = formats.gemv_tq4_1s_ref(raw, m, k, x)
    assert rel(got, model) <= 1e-5
    assert np.linalg.norm(got - exact) ** 2 / np.linalg.norm(exact) ** 2 <= 5e-4


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0"])
@settings(max_examples=20)
@given(data=st.data())
def test_int8_gemv_matches_q8_1_reference(fmt, data):
    """mode="fast" up to 8 tokens: x quantized to Q8_1, the int8 dp4a lane GEMV; within 1e-5 of the float64
    product with the Q8_1-rounded activation (integer dots are exact). Shapes include split-K (small M, long K) and
    tails (K/32 not a multiple of 32; Q6_K: K a multiple of 512, its lane's); outputs poisoned; deterministic."""
    import ptxgen.runtime as r

    m = data.draw(st.sampled_from([1, 7, 127, 129, 300, 2048]))
    k = data.draw(st.sampled_from({"q8_0": [256, 512, 1088, 2304, 4096, 14336], "q6_K": [512, 2560, 4096, 14336]}
                                  .get(fmt, [256, 512, 2304, 4096, 14336])))
    t = data.draw(st.sampled_from([1, 2, 3, 5, 8]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    out = r.DeviceArray.empty((t, m), np.float32)
    out.owner.fill_bytes(0xFF)
    with tuning.override(fast_lanes_max_tokens=8):  # the lane GEMV at every T it has a build for (the rule runs
        r.mul_mat(w, x, out=out, mode="fast")      # Q5_K's and Q6_K's nowhere on the H200: slower than exact)
        again = r.mul_mat(w, x, mode="fast")
    got = out.numpy()
    assert np.isfinite(got).all()
    # relative to the products' magnitudes, Σ|w||x_q| (fp32 rounding scales with them): a lone output (M = T = 1)
    # whose scale and min terms cancel is small beside its own rounding
    xq = formats.ggml.dequantize_q8_1(formats.quantize("q8_1", x.reshape(-1, 32))).reshape(x.shape)
    mag = np.abs(xq).astype(np.float64) @ np.abs(formats.dequantize(fmt, raw, (m, k))).astype(np.float64).T
    assert np.linalg.norm(got - formats.gemm_q8_1_ref(fmt, raw, m, k, x)) <= 1e-5 * np.linalg.norm(mag)
    np.testing.assert_array_equal(again.view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"])
@pytest.mark.parametrize("t", [9, 40])
def test_fast_mode_past_8_tokens_runs_the_exact_kernels(fmt, t):
    """mode="fast" above the int8 kernels' T (Q4_K's int8 MMQ runs to q8_max_tokens): the exact routes, the same
    kernels and the same bits as mode="exact"."""
    import ptxgen.runtime as r
    from ptxgen.runtime.ops import mmq_path, q8_path

    if fmt == "q4_K" and q8_path(t, mmq_path()):
        pytest.skip("Q4_K runs its int8 MMQ at this T")
    rng = np.random.default_rng(t)
    m, k = 300, 2048
    w = r.QuantTensor.from_raw(fmt, formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32)), (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    assert r.mul_mat_plan(w, t, mode="fast").kernels == r.mul_mat_plan(w, t).kernels
    np.testing.assert_array_equal(r.mul_mat(w, x, mode="fast").view(np.uint32), r.mul_mat(w, x).view(np.uint32))


@pytest.mark.parametrize("fmt,t", [("tq4_1s", t) for t in (1, 3, 8, 11)] + [("q4_K", t) for t in (1, 3, 5, 8, 9, 16)])
def test_tensor_core_gemvs_forced(fmt, t, monkeypatch):
    """The tensor-core exact GEMVs forced by their knobs (sm_90): TQ4_1S — PTXGEN_TQ4_MMA=1, prep_tq4_1s_mma +
    gemv_tq4_1s_mma at every T; Q4_K — PTXGEN_Q4K_MMA=1, prep_mma_f16 + gemv_q4_k_mma (T ≤ 8)
    or gemv_q4_k_mma_n16 (9-16, instead of the MMQ). Within 1e-5 of the float64 reference, outputs poisoned
    first, the same bits run to run."""
    import ptxgen.runtime as r
    from ptxgen.runtime.driver import current

    if current().sm != 90:
        pytest.skip("the tensor-core GEMVs are built for sm_90a")
    setknob(monkeypatch, {"tq4_1s": "PTXGEN_TQ4_MMA", "q4_K": "PTXGEN_Q4K_MMA"}[fmt], "1")
    rng = np.random.default_rng(t + (100 if fmt == "q4_K" else 0))
    m, k = 300, 3584
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    out = r.DeviceArray.empty((t, m), np.float32)
    out.owner.fill_bytes(0xFF)
    r.mul_mat(w, x, out=out)
    got = out.numpy()
    want = formats.gemv_tq4_1s_ref(raw, m, k, x) if fmt == "tq4_1s" else formats.gemm_ref(fmt, raw, m, k, x)
    assert rel(got, want) <= 1e-5
    np.testing.assert_array_equal(r.mul_mat(w, x).view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("t", [3, 4, 5])
def test_tq4_1s_default_dispatch_takes_the_tensor_core_gemv_from_3_tokens(t, monkeypatch):
    """mul_mat's exact TQ4_1S at 3-5 tokens on a matrix of ≥ 14·2^20 weights (4608 x 3584, sm_90): the tensor-core
    GEMV (ops.mma_min_tokens), within 1e-5 of the float64 reference on NaN-poisoned outputs, the same bits run to
    run."""
    import ptxgen.runtime as r
    from ptxgen.runtime import kernels
    from ptxgen.runtime.driver import current

    if current().sm != 90:
        pytest.skip("the tensor-core GEMVs are built for sm_90a")
    loaded, load = [], kernels.load
    monkeypatch.setattr(kernels, "load", lambda name, *a, **kw: loaded.append(name) or load(name, *a, **kw))
    rng = np.random.default_rng(40 + t)
    m, k = 4608, 3584
    raw = formats.quantize("tq4_1s", rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw("tq4_1s", raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    out = r.DeviceArray.empty((t, m), np.float32)
    out.owner.fill_bytes(0xFF)
    r.mul_mat(w, x, out=out)
    assert "gemv_tq4_1s_mma_m16" in loaded and not any(n.startswith("gemv_tq4_1s_t") for n in loaded), loaded
    got = out.numpy()
    assert rel(got, formats.gemv_tq4_1s_ref(raw, m, k, x)) <= 1e-5
    np.testing.assert_array_equal(r.mul_mat(w, x).view(np.uint32), got.view(np.uint32))


def test_q4_k_tensor_core_gemv_non_finite_activations_give_non_finite_outputs():
    """mul_mat's default exact Q4_K path at T = 2-8 (sm_90: the tensor-core GEMV) with a NaN in one token and an
    inf in another: those tokens' outputs are all non-finite (NaN where the reference has ±inf, the documented
    difference: the min term is factored out), the other tokens' are finite and within 1e-5."""
    import ptxgen.runtime as r

    rng = np.random.default_rng(7)
    m, k, t = 200, 2048, 4
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    x[1, 300], x[2, 77] = np.inf, np.nan
    got = r.mul_mat(w, x)
    assert not np.isfinite(got[1]).any() and np.isnan(got[2]).all()
    ok = [0, 3]
    assert np.isfinite(got[ok]).all()
    assert rel_ref(got[ok], "q4_K", raw, m, k, x[ok]) <= 1e-5


@pytest.mark.parametrize("m,k", [(1, 256), (129, 768), (300, 14336), (70, 18944), (2000, 3584)])
def test_q4_k_single_token_register_gemv(m, k, monkeypatch):
    """PTXGEN_Q4K_XR=1: exact Q4_K at T = 1 runs gemv_q4_k_xr (the activation in registers, no prep): within 1e-5
    of the float64 reference with outputs NaN-poisoned first, bit-identical run to run; an inf or a NaN in x
    makes every output non-finite, as the reference's are. Unset (the default) takes the other kernels."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    ran = []
    load = ops.kernels.load
    monkeypatch.setattr(ops.kernels, "load", lambda name, *a, **kw: ran.append(name) or load(name, *a, **kw))
    rng = np.random.default_rng(m + k)
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    x = (rng.standard_normal((1, k)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
    out = r.DeviceArray.empty((1, m), np.float32)
    out.owner.fill_bytes(0xFF)
    setknob(monkeypatch, "PTXGEN_Q4K_XR", "1")
    r.mul_mat(w, x, out=out)
    assert ran == ["gemv_q4_k_xr"]
    got = out.numpy()
    want = formats.gemm_ref("q4_K", raw, m, k, x)
    assert np.isfinite(got).all() and rel(got, want) <= 1e-5
    for _ in range(2):
        np.testing.assert_array_equal(r.mul_mat(w, x).view(np.uint32), got.view(np.uint32))
    for bad in (np.inf, np.nan):
        xb = x.copy()
        xb[0, k // 3] = bad
        assert not np.isfinite(r.mul_mat(w, xb)).any()
    setknob(monkeypatch, "PTXGEN_Q4K_XR", None)
    ran.clear()
    other = r.mul_mat(w, x)
    assert "gemv_q4_k_xr" not in ran and rel(other, want) <= 1e-5


def _q4k_mul_mat(monkeypatch, m, k, t, arch, env):
    """mul_mat on random Q4_K weights (large matrices repeat a quantized block of 256 rows: quantizing 16 M weights
    takes minutes) and activations of a random scale, `env` set first, outputs NaN-poisoned: (the kernels it
    loaded, w, x, y, the float64 reference)."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    ran = []
    load = ops.kernels.load
    monkeypatch.setattr(ops.kernels, "load", lambda name, *a, **kw: ran.append(name) or load(name, *a, **kw))
    for name, v in env.items():
        setknob(monkeypatch, name, v)
    rng = np.random.default_rng(m + k + t)
    rows = min(m, 256)
    raw = formats.quantize("q4_K", rng.standard_normal((rows, k)).astype(np.float32))
    raw = np.tile(raw, (-(-m // rows), 1))[:m]
    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    x = (rng.standard_normal((t, k)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
    out = r.DeviceArray.empty((t, m), np.float32)
    out.owner.fill_bytes(0xFF)
    r.mul_mat(w, x, out=out, arch=arch)
    return ran, w, x, out.numpy(), formats.gemm_ref("q4_K", raw, m, k, x)


def _into_poisoned(r, w, x, **kw):
    """mul_mat(w, x, **kw) into an output filled with NaN bytes (0xFF) first: what the call wrote, as NumPy."""
    out = r.DeviceArray.empty((x.shape[0], w.shape[0]), np.float32)
    out.owner.fill_bytes(0xFF)
    r.mul_mat(w, x, out=out, **kw)
    return out.numpy()


def _same_bits_and_per_token_non_finite(w, x, got, arch):
    """mul_mat again gives the same bits; an inf or a NaN in the last token's x makes that token's outputs
    non-finite and leaves the others finite."""
    import ptxgen.runtime as r

    t, k = x.shape
    for _ in range(2):
        np.testing.assert_array_equal(r.mul_mat(w, x, arch=arch).view(np.uint32), got.view(np.uint32))
    for bad in (np.inf, np.nan):
        xb = x.copy()
        xb[t - 1, k // 3] = bad
        yb = r.mul_mat(w, xb, arch=arch)
        assert not np.isfinite(yb[t - 1]).any() and np.isfinite(yb[:t - 1]).all()


@pytest.mark.parametrize("m,k,t,arch,knob", [(1, 256, 1, None, "1"), (129, 768, 1, None, "1"), (300, 14336, 1, None, "1"),
                                             (70, 18944, 1, None, "1"), (2000, 3584, 1, None, "1"),
                                             (129, 768, 1, "sm_89", "1"), (2000, 3584, 1, "sm_89", "1"),
                                             (4096, 4096, 1, None, None), (129, 768, 1, None, None),
                                             (300, 14336, 2, None, "1"), (129, 768, 3, None, "1"), (1, 512, 4, None, "1"),
                                             (2000, 3584, 4, "sm_89", "1"), (2000, 3584, 2, "sm_89", "1"),
                                             (4096, 4096, 3, None, None), (4096, 4096, 2, None, None),
                                             (300, 14336, 8, None, "1"), (129, 768, 5, None, "1"),
                                             (2000, 3584, 7, "sm_89", "1")])
@pytest.mark.parametrize("i8", [False, True], ids=["fp16", "int8"])
def test_q4_k_few_token_tensor_core_gemv(m, k, t, arch, knob, i8, monkeypatch):
    """Exact Q4_K slices of 1-8 tokens on prep_q4k_t{1,2,4,8} + gemv_q4_k_mma_t{1,2,4,8} — by default from
    Q4K_T1_MIN_WEIGHTS (4096 x 4096) up to Q4K_FEW_MAX_TOKENS tokens, with PTXGEN_Q4K_T1=1 at any size (5-8 tokens:
    with the limit raised to 8), also the sm_89 builds (fewer ring stages) compiled for this GPU: within 1e-5 of
    the float64 reference with outputs NaN-poisoned first, bit-identical run to run; an inf or a NaN in one token's
    x makes that token's outputs non-finite, as the reference's are, and leaves the others finite. Below the
    threshold the default takes the other kernels, and PTXGEN_Q4K_T1=0 does everywhere, with results within the
    same bar. The same for the int8 builds prep_q4k_i8_t* + gemv_q4_k_i8_t* (rule few_i8_max_tokens raised to 8;
    "fp16": 0)."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    if t > ops.RULES.q4k_few_max_tokens:
        tuning.set(q4k_few_max_tokens=8)
    tuning.set(few_i8_max_tokens={"q4_K": 8 if i8 else 0})
    kind, prep = ("i8", "prep_q4k_i8") if i8 else ("mma", "prep_q4k")
    ran, w, x, got, want = _q4k_mul_mat(monkeypatch, m, k, t, arch, {"PTXGEN_Q4K_T1": knob} if knob else {})
    assert np.isfinite(got).all() and rel(got, want) <= 1e-5
    if not knob and m * k < ops.RULES.q4k_t1_min_weights:
        assert not any(name.startswith(("gemv_q4_k_mma_t", "gemv_q4_k_i8_t")) for name in ran)
        return
    nt = next(v for v in (1, 2, 4, 8) if v >= t)
    if nt < 8:  # one launch: the fused build makes the records itself, the same bits as the prep kernel's
        assert ran == [f"gemv_q4_k_{kind}_t{nt}_fused"]
        setknob(monkeypatch, "PTXGEN_Q4K_FUSED", "0")
        ran.clear()
        assert np.array_equal(r.mul_mat(w, x, arch=arch), got) and ran == [f"{prep}_t{nt}", f"gemv_q4_k_{kind}_t{nt}"]
        setknob(monkeypatch, "PTXGEN_Q4K_FUSED", None)
    else:
        assert ran == [f"{prep}_t{nt}", f"gemv_q4_k_{kind}_t{nt}"]
    _same_bits_and_per_token_non_finite(w, x, got, arch)
    setknob(monkeypatch, "PTXGEN_Q4K_T1", "0")
    ran.clear()
    other = r.mul_mat(w, x, arch=arch)
    assert not any(name.startswith(("gemv_q4_k_mma_t", "gemv_q4_k_i8_t")) for name in ran) and rel(other, want) <= 1e-5


@pytest.mark.parametrize("m,k,t", [(16897, 512, 16), (20000, 768, 9), (16896, 512, 12)])
def test_sixteen_token_calls_past_one_round_of_t16h_take_the_skinny_gemm(m, k, t, monkeypatch):
    """Exact-mode Q4_K with 9-16 tokens where gemv_q4_k_mma_t16h's row CTAs (128 rows each) exceed one round of
    its resident CTAs (M > 132 x 128 on the H200) runs prep_q4k_t16h + mmq_q4_k_rega_n16 (the same records, shared
    by the CTA's warps), at or below it t16h: within 1e-3 of the float64 reference (outputs NaN-poisoned first),
    bit-identical run to run, non-finite x only in its token's outputs; PTXGEN_MMQ_SKINNY=0 keeps t16h, within
    the same bar."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops
    from ptxgen.runtime.driver import current

    ran, w, x, got, want = _q4k_mul_mat(monkeypatch, m, k, t, None, {})
    call = list(ran)  # the call's loads (the one below is the test's)
    t16h = ops.kernels.load("gemv_q4_k_mma_t16h")
    past = -(-m // int(t16h.meta["rows_per_cta"])) > t16h.resident_per_sm() * current().sm_count
    if current().sm_count == 132:  # the H200: one t16h CTA per SM (the occupancy calculator), 128 rows each
        assert past == (m > 16896)
    assert call == ["prep_q4k_t16h", "mmq_q4_k_rega_n16" if past else "gemv_q4_k_mma_t16h"], call
    assert np.isfinite(got).all() and rel(got, want) <= 1e-3, rel(got, want)
    _same_bits_and_per_token_non_finite(w, x, got, None)
    setknob(monkeypatch, "PTXGEN_MMQ_SKINNY", "0")
    ran.clear()
    other = r.mul_mat(w, x)
    assert ran == ["prep_q4k_t16h", "gemv_q4_k_mma_t16h"] and rel(other, want) <= 1e-3


@pytest.mark.parametrize("m,k,t,arch", [(129, 768, 9, None), (300, 14336, 16, None), (2000, 3584, 12, None),
                                        (1, 512, 16, None), (2000, 3584, 16, "sm_89")])
def test_q4_k_sixteen_token_fp16_gemv(m, k, t, arch, monkeypatch):
    """Q4_K slices of 9-16 tokens on prep_q4k_t16h + gemv_q4_k_mma_t16h (PTXGEN_Q4K_T16H=1; fp16 hi parts of x,
    one B column per token), also the sm_89 build compiled for this GPU: within 1e-3 of the float64 reference (the
    prefill GEMMs' bar; ~2e-4 expected) with outputs NaN-poisoned first, bit-identical run to run; an inf or a NaN
    in one token's x makes that token's outputs non-finite and leaves the others finite. PTXGEN_Q4K_T16H=0 gives
    these calls back to the exact 16-token GEMV (1e-5)."""
    import ptxgen.runtime as r

    ran, w, x, got, want = _q4k_mul_mat(monkeypatch, m, k, t, arch, {"PTXGEN_Q4K_T16H": "1"})
    assert ran == ["prep_q4k_t16h", "gemv_q4_k_mma_t16h"]
    assert np.isfinite(got).all() and rel(got, want) <= 1e-3, rel(got, want)
    _same_bits_and_per_token_non_finite(w, x, got, arch)
    setknob(monkeypatch, "PTXGEN_Q4K_T16H", "0")
    ran.clear()
    other = r.mul_mat(w, x, arch=arch)
    assert "gemv_q4_k_mma_t16h" not in ran and rel(other, want) <= 1e-5


@pytest.mark.parametrize("m,k,t,arch", [(1, 256, 1, None), (129, 768, 2, None), (300, 14336, 5, None),
                                        (2000, 3584, 8, None), (4096, 4096, 9, None), (300, 14336, 16, None),
                                        (129, 768, 3, "sm_89"), (300, 1024, 12, "sm_89"), (300, 14336, 20, None),
                                        (2000, 3584, 32, None), (129, 768, 25, "sm_89")])
def test_q5_k_few_token_tensor_core_gemv(m, k, t, arch, monkeypatch):
    """Q5_K on the few-token tensor-core builds (RULES.codec_few_max_tokens raised; off until timed): prep_q4k_t* +
    gemv_q5_k_mma_t{1,2,4,8} within 1e-5 of float64 (exact), gemv_q5_k_mma_t16h and from 17 tokens the skinny GEMM
    mmq_q5_k_rega_n32 within 1e-3 (fp16 activations),
    the sm_89 builds too; outputs NaN-poisoned first, bit-identical run to run, and 1-4 tokens' one-launch builds
    (gemv_q5_k_mma_t*_fused, eager) the bits of prep + GEMV. GPU == emulator for each build is
    test_gpu_emu_crosscheck's."""
    import ptxgen.runtime as r

    rng = np.random.default_rng(m + k + t)
    raw = formats.quantize("q5_K", rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw("q5_K", raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    want = formats.gemm_ref("q5_K", raw, m, k, x)
    nt = "t32h" if t > 16 else "t16h" if t > 8 else f"t{next(v for v in (1, 2, 4, 8) if v >= t)}"
    with tuning.override(codec_few_max_tokens={"q5_K": 32}, few_i8_max_tokens={"q5_K": 0},  # (the fp16 builds,
                         codec_few_t1_min_weights=0):  # small weights too)
        two = [f"prep_q4k_{nt}", "mmq_q5_k_rega_n32" if t > 16 else f"gemv_q5_k_mma_{nt}"]
        assert r.mul_mat_plan(w, t, arch=arch).kernels == ([f"gemv_q5_k_mma_{nt}_fused"] if t <= 4 else two)
        got = _into_poisoned(r, w, x, arch=arch)
        assert np.isfinite(got).all() and rel(got, want) <= (1e-3 if t > 8 else 1e-5)
        np.testing.assert_array_equal(r.mul_mat(w, x, arch=arch), got)
        setknob(monkeypatch, "PTXGEN_Q4K_FUSED", "0")  # (the knob names Q4_K; it picks every few-token build's launch)
        assert r.mul_mat_plan(w, t, arch=arch).kernels == two
        np.testing.assert_array_equal(r.mul_mat(w, x, arch=arch), got)


@pytest.mark.parametrize("fmt", ["q6_K", "q8_0", "tq4_1s"])
@pytest.mark.parametrize("m,k,t,arch", [(4, 512, 1, None), (132, 1536, 2, None), (300, 14336, 5, None),
                                        (2000, 3584, 8, None), (4096, 4096, 1, None), (132, 1536, 3, "sm_89")])
def test_mma_block_codec_few_token_gemv(fmt, m, k, t, arch, monkeypatch):
    """Q6_K, Q8_0 and TQ4_1S on the few-token builds (RULES.codec_few_max_tokens raised: Q6_K's and Q8_0's past
    codec_few_t1_min_weights, TQ4_1S's off until timed): prep_sub16_t* (TQ4_1S: prep_rot16_t*, of the rotated x) +
    gemv_<fmt>_mma_t{1,2,4,8} within 1e-5 of float64 (exact), the sm_89 builds too, the CTA widths the launch picks
    (TQ4_1S's one-token build: 16 warps a CTA on the H200); outputs NaN-poisoned first, bit-identical run to run,
    and 1-4 tokens' one-launch builds (gemv_<fmt>_mma_t*_fused, eager; none for TQ4_1S) the bits of prep + GEMV.
    GPU == emulator for each build is test_gpu_emu_crosscheck's."""
    import ptxgen.runtime as r

    rng = np.random.default_rng(m + k + t)
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    want = formats.gemm_ref(fmt, raw, m, k, x)
    nt = next(v for v in (1, 2, 4, 8) if v >= t)
    fused = t <= 4 and fmt != "tq4_1s"
    with tuning.override(codec_few_max_tokens={fmt: 8}, codec_few_t1_min_weights=0,
                         few_i8_max_tokens={fmt: 0}):  # (the fp16 builds; Q6_K's int8 ones: test_int8_few_token_gemv)
        two = [GemvKernel("prep_few", fmt, nt).name, GemvKernel("few", fmt, nt).name]
        assert r.mul_mat_plan(w, t, arch=arch).kernels == ([GemvKernel("few", fmt, nt, fused=True).name] if fused
                                                           else two)
        got = _into_poisoned(r, w, x, arch=arch)
        assert np.isfinite(got).all() and rel(got, want) <= 1e-5
        np.testing.assert_array_equal(r.mul_mat(w, x, arch=arch), got)
        setknob(monkeypatch, "PTXGEN_Q4K_FUSED", "0")  # (the knob names Q4_K; it picks every few-token build's launch)
        assert r.mul_mat_plan(w, t, arch=arch).kernels == two
        np.testing.assert_array_equal(r.mul_mat(w, x, arch=arch), got)


@pytest.mark.parametrize("fmt", ["q6_K", "q8_0"])
@pytest.mark.parametrize("m,k,t,arch", [(4096, 14336, 16, None), (300, 1024, 9, None), (2000, 3584, 12, None),
                                        (136, 2048, 16, "sm_89")])
def test_mma_block_codec_sixteen_token_gemv(fmt, m, k, t, arch):
    """Q6_K and Q8_0 at 9-16 tokens on prep_sub16_t16h + gemv_<fmt>_mma_t16h (RULES.codec_few_max_tokens 16, as
    shipped since 2026-12-06): within 1e-3 of float64 (fp16 activations, as the other t16h builds and the
    GEMMs), outputs NaN-poisoned first, bit-identical run to run, fp16 x the bits of its fp32 widening; Q6_K's sm_89
    build too (Q8_0's ring does not fit there: the route after runs). GPU == emulator for each build is
    test_gpu_emu_crosscheck's."""
    import ptxgen.runtime as r

    rng = np.random.default_rng(m + k + t)
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    x16 = x.astype(np.float16)
    want = formats.gemm_ref(fmt, raw, m, k, x)
    with tuning.override(codec_few_max_tokens={fmt: 16}):
        plan = r.mul_mat_plan(w, t, arch=arch).kernels
        assert (plan == ["prep_sub16_t16h", f"gemv_{fmt.lower()}_mma_t16h"]) == (fmt == "q6_K" or arch is None), plan
        got = _into_poisoned(r, w, x, arch=arch)
        assert np.isfinite(got).all() and rel(got, want) <= 1e-3
        np.testing.assert_array_equal(r.mul_mat(w, x, arch=arch), got)
        np.testing.assert_array_equal(r.mul_mat(w, x16, arch=arch), r.mul_mat(w, x16.astype(np.float32), arch=arch))


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"])
@pytest.mark.parametrize("m,k,t,arch", [(4096, 14336, 8, None), (14336, 4096, 5, None), (300, 1024, 4, None),
                                        (136, 2048, 3, None), (1000, 3584, 8, "sm_89")])
def test_few_token_gemv_with_records_shared_by_the_cta(fmt, m, k, t, arch, monkeypatch):
    """gemv_<fmt>_mma_t{4,8}s (RULES.few_shared_min_tokens raised; off until timed): the records of the format's
    prep (prep_q4k_t*, prep_sub16_t*, prep_rot16_t*) in one ring a CTA, its row tiles on the same K-steps, split-K
    over gridDim.y — within 1e-5 of float64 (exact),
    outputs NaN-poisoned first, bit-identical run to run, within 3e-6 of the per-warp build's result (its two nibble
    chains summed as one: ~2x the rounding, ~7e-7 of float64 in the emulator); the sm_89
    build too. GPU == emulator for each build is test_gpu_emu_crosscheck's."""
    import ptxgen.runtime as r

    from ptxgen.testing.strategies import random_raw

    if arch == "sm_89" and fmt in ("q8_0", "tq4_1s"):
        t = 4  # (their 8-token builds, per-warp and shared, do not fit sm_89's 99 KB beside each other's route)
    rng = np.random.default_rng(m + k + t)
    raw = random_raw(fmt, m, k, rng)  # (valid blocks of every bit pattern, finite scales; no quantizer: 50x faster)
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    want = formats.gemm_ref(fmt, raw, m, k, x)
    nt = 4 if t <= 4 else 8
    setknob(monkeypatch, "PTXGEN_Q4K_FUSED", "0")  # (eager calls of 1-4 tokens would run the one-launch builds)
    setknob(monkeypatch, "PTXGEN_Q4K_T1", "1")  # (Q4_K's few-token builds at any size: by default from 14·2^20 weights)
    with tuning.override(codec_few_max_tokens={"q5_K": 32, "q6_K": 8, "q8_0": 8, "tq4_1s": 8},
                         codec_few_t1_min_weights=0, few_i8_max_tokens={}):  # (the fp16 per-warp builds)
        per_warp = r.mul_mat(w, x, arch=arch)
        with tuning.override(few_shared_min_tokens={fmt: 1}):
            plan = r.mul_mat_plan(w, t, arch=arch).kernels
            assert plan == [GemvKernel("prep_few", fmt, nt).name, GemvKernel("few", fmt, nt, shared=True).name], plan
            out = r.DeviceArray.empty((t, m), np.float32)
            out.owner.fill_bytes(0xFF)
            r.mul_mat(w, x, out=out, arch=arch)
            got = out.numpy()
            assert np.isfinite(got).all() and rel(got, want) <= 1e-5 and rel(got, per_warp) <= 3e-6
            np.testing.assert_array_equal(r.mul_mat(w, x, arch=arch), got)


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0"])
@pytest.mark.parametrize("m,k,t,arch", [(4096, 14336, 1, None), (14336, 4096, 2, None), (300, 1024, 4, None),
                                        (136, 2048, 8, None), (1000, 3584, 3, "sm_89"), (1, 256, 1, None)])
def test_int8_few_token_gemv(fmt, m, k, t, arch, monkeypatch):
    """gemv_<fmt>_i8_t{nt} on prep_q{4,6}k_i8_t{nt}'s digit planes (RULES.few_i8_max_tokens raised to 8), eager
    and in a CUDA graph: within 1e-5 of float64 (exact), outputs NaN-poisoned first, bit-identical run to run, within
    2e-6 of the fp16 few-token build's result (both scaled by the products' magnitude); the one-launch build
    (eager, 1-4 tokens) bit-identical to the two launches; the sm_89 build too. GPU == emulator is
    test_gpu_emu_crosscheck's."""
    import ptxgen.runtime as r

    from ptxgen.testing.strategies import random_raw

    if fmt == "q6_K" and k == 256:  # (Q6_K's few-token builds: rows of an even number of super-blocks, m·row_bytes
        m, k = 8, 512  # a multiple of 16)
    rng = np.random.default_rng(m + k + t)
    raw = random_raw(fmt, m, k, rng)
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    want = formats.gemm_ref(fmt, raw, m, k, x)
    nt = next(v for v in (1, 2, 4, 8) if v >= t)
    setknob(monkeypatch, "PTXGEN_Q4K_T1", "1")  # (the few-token builds at any size)
    # (not route small_gemv; Q5_K's few-token builds at any size)
    with tuning.override(codec_gemv_t1_max_weights={"q4_K": 0}, codec_few_t1_min_weights=0,
                         few_i8_max_tokens={"q4_K": 0, "q5_K": 0, "q6_K": 0, "q8_0": 0}):
        fp16 = r.mul_mat(w, x, arch=arch)
        with tuning.override(few_i8_max_tokens={fmt: 8}):
            eager = r.mul_mat_plan(w, t, arch=arch).kernels
            assert eager == ([GemvKernel("few", fmt, nt, i8=True, fused=True).name] if nt <= 4 else
                             [GemvKernel("prep_few", fmt, nt, i8=True).name, GemvKernel("few", fmt, nt, i8=True).name]), eager
            one = r.mul_mat(w, x, arch=arch)  # (eager, 1-4 tokens: the one-launch build)
            setknob(monkeypatch, "PTXGEN_Q4K_FUSED", "0")
            plan = r.mul_mat_plan(w, t, arch=arch).kernels
            assert plan == [GemvKernel("prep_few", fmt, nt, i8=True).name,
                            GemvKernel("few", fmt, nt, i8=True).name], plan
            out = r.DeviceArray.empty((t, m), np.float32)
            out.owner.fill_bytes(0xFF)
            r.mul_mat(w, x, out=out, arch=arch)
            got = out.numpy()
            sc = product_scale(fmt, raw, m, k, x)  # (M = T = 1: one sum, whose cancellation the unscaled measure
            # would amplify — H100 2026-12-06, Q8_0 1x256: 4.6e-6 of float64 unscaled, 8.5e-7 scaled)
            assert np.isfinite(got).all() and rel(got, want, sc) <= 1e-5 and rel(got, fp16, sc) <= 2e-6, (
                rel(got, want, sc), rel(got, fp16, sc))
            np.testing.assert_array_equal(r.mul_mat(w, x, arch=arch), got)
            np.testing.assert_array_equal(one, got)
            if arch is None:  # captured into a graph on torch's stream
                import torch

                np.testing.assert_array_equal(graph_replayed(w, torch.from_numpy(x).cuda()), got)


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0"])
def test_int8_few_token_gemv_with_outlier_activation_channels(fmt):
    """The int8 builds hold x to 2^-22 of its super-block's max, not of each value (formats.tq4_1s.q4k_i8_records):
    an LLM's outlier channels (here 6 of them at 10^3 and 10^4 x the rest) on the int8 builds of every format
    (RULES.few_i8_max_tokens raised to 8) stay within exact mode's 1e-5 of float64, as test_accuracy finds for the record
    model; outputs NaN-poisoned first."""
    import ptxgen.runtime as r

    rng = np.random.default_rng(11)
    m, k = 2048, 4096
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    x = rng.standard_normal((2, k)).astype(np.float32)
    cols = rng.choice(k, 6, replace=False)
    x[:, cols[:3]] *= np.float32(1e3)
    x[:, cols[3:]] *= np.float32(1e4)
    with tuning.override(few_i8_max_tokens={fmt: 8}, codec_few_max_tokens={fmt: 8}, codec_few_t1_min_weights=0):
        for t in (1, 2):
            assert any("_i8_" in n for n in r.mul_mat_plan(w, t).kernels), r.mul_mat_plan(w, t).kernels
            got = _into_poisoned(r, w, x[:t])
            assert np.isfinite(got).all() and rel_ref(got, fmt, raw, m, k, x[:t]) <= 1e-5


@pytest.mark.parametrize("fmt", ["q5_K", "q6_K", "q8_0"])
@pytest.mark.parametrize("m,k,t", [(1, 256, 1), (300, 1024, 3), (4096, 4096, 8), (100, 14336, 16), (129, 3584, 2),
                                   (64, 2048, 19)])  # (M < 128: T = 16, 19 stay on the GEMV, in 2 and 3 slices)
def test_codec_gemv_of_the_other_formats(fmt, m, k, t):
    """Q5_K, Q6_K and Q8_0 (mode "exact") on the codec-generic GEMV gemv_<fmt>_f32_t<nt>, in slices of up to 8
    tokens: within 1e-5 of the float64 reference with ggml-quantized weights, the output poisoned first, bit-identical
    run to run; the kernels' bytes and x from torch on torch's stream."""
    import torch

    import ptxgen.runtime as r

    rng = np.random.default_rng(m + k + t)
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    xt = torch.from_numpy(x).cuda()
    y = torch.full((t, m), float("nan"), device="cuda")
    # the tensor-core GEMVs off (test_codec_tensor_core_gemv), and Q5_K's few-token builds
    # (test_q5_k_few_token_tensor_core_gemv)
    with tuning.override(codec_mma_max_tokens=0, codec_few_max_tokens={"q5_K": 0}):
        r.mul_mat(w, xt, out=y)
        got = y.cpu().numpy()
        assert r.mul_mat_plan(w, t).kernels[0].startswith(f"gemv_{fmt.lower()}_f32_t")
        assert np.isfinite(got).all() and rel_ref(got, fmt, raw, m, k, x) <= 1e-5
        assert np.array_equal(r.mul_mat(w, xt).cpu().numpy(), got)



@pytest.mark.parametrize("fmt", ["q6_K", "q8_0"])
@pytest.mark.parametrize("m,k,t", [(4096, 4096, 1), (136, 1024, 3), (4096, 14336, 8), (2000, 3584, 5), (8, 1024, 2),
                                   (4096, 14336, 16), (136, 1024, 11), (4100, 2048, 2)])
def test_codec_tensor_core_gemv(fmt, m, k, t):
    """The codecs' tensor-core decode GEMV (prep_mma_f16 + gemv_<fmt>_mma, T from 1 to 16 with the rules lifted:
    9-16 tokens in two groups, gemv_<fmt>_mma_n16; the TMA build gemv_<fmt>_mma_tma where a row is a multiple of
    16 bytes, the bulk-copy build elsewhere):
    within 1e-5 of the float64 reference on ggml-quantized weights and on random blocks (every scale and bit
    pattern), the output poisoned first, bit-identical run to run, x from torch on torch's stream."""
    import torch

    import ptxgen.runtime as r
    from ptxgen.testing.strategies import random_raw

    rng = np.random.default_rng(m + k + t)
    for raw in (formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32)), random_raw(fmt, m, k, rng)):
        w = r.QuantTensor.from_raw(fmt, raw, (m, k))
        x = rng.standard_normal((t, k)).astype(np.float32)
        xt = torch.from_numpy(x).cuda()
        y = torch.full((t, m), float("nan"), device="cuda")
        with tuning.override(codec_mma_min_tokens=1, codec_mma_max_tokens=16,
                             codec_few_max_tokens={"q5_K": 32}):  # (not the few-token builds ahead of it)
            tma = t <= 8 and k // 256 * codecs.get(fmt).MMA_STEP_BYTES % 16 == 0  # rows of 16-byte multiples
            name = f"gemv_{fmt.lower()}_mma" + ("_n16" if t > 8 else "") + ("_tma" if tma else "")
            assert r.mul_mat_plan(w, t).kernels == ["prep_mma_f16"] * -(-t // 8) + [name]
            r.mul_mat(w, xt, out=y)
            again = r.mul_mat(w, xt).cpu().numpy()
        got = y.cpu().numpy()
        assert np.isfinite(got).all() and rel_ref(got, fmt, raw, m, k, x) <= 1e-5
        assert np.array_equal(again, got)


@pytest.mark.parametrize("fmt", ["q4_K", "q6_K"])
@pytest.mark.parametrize("t", [1, 3, 40, 512])
def test_a_cat_of_projections_is_their_products_side_by_side(fmt, t):
    """mul_mat(QuantTensor.cat([a, b]), x) = [x @ A.T | x @ B.T]: each column range within the bound of the kernels
    its T runs (exact GEMVs 1e-5 of the float64 product, fp16 GEMMs 1e-3), as torch.split views too."""
    import ptxgen.runtime as r

    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(t)
    k, ms = 2048, (384, 128, 256)
    raws = [formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32)) for m in ms]
    w = r.QuantTensor.cat([r.QuantTensor.from_raw(fmt, raw, (m, k)) for raw, m in zip(raws, ms)])
    x = torch.randn(t, k, device="cuda")
    y = r.mul_mat(w, x)
    assert y.shape == (t, sum(ms))
    xd = x.double().cpu().numpy()
    for part, raw, m in zip(torch.split(y, list(ms), dim=1), raws, ms):
        want = xd @ formats.dequantize(fmt, raw, (m, k)).astype(np.float64).T
        assert rel(part.cpu().numpy(), want) <= (1e-5 if t <= 8 else 1e-3), m


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0"])
@pytest.mark.parametrize("t", [1, 2, 3, 8])
def test_fp16_x_in_a_graph_goes_to_the_x16_preps_with_the_fp32_bits(fmt, t):
    """A graph-captured decode call on a float16 x runs the few-token prep's _x16 build (no convert_f32 launch)
    and gives the bits of the same values as float32 — the int8 builds' records (Q4_K, Q5_K, Q6_K, Q8_0 at 1-2 /
    1-4 / 1-8 / 1-8 tokens) and Q4_K's fp16 ones (3-8)."""
    import torch

    import ptxgen.runtime as r
    from ptxgen.runtime import ops
    from ptxgen.testing.strategies import random_raw

    m, k = 4096, 4096
    rng = np.random.default_rng(t + len(fmt))
    w = r.QuantTensor.from_raw(fmt, random_raw(fmt, m, k, rng), (m, k))
    x16 = (rng.standard_normal((t, k)) * 3).astype(np.float16)
    plan = ops.mul_mat_plan(w, t, graph=True, x_dtype="float16").kernels
    assert plan[0].startswith("prep_") and plan[0].endswith("_x16"), plan
    want = r.mul_mat(w, x16.astype(np.float32))
    np.testing.assert_array_equal(graph_replayed(w, torch.from_numpy(x16).cuda()), want)


@pytest.mark.parametrize("fmt,m,k", [("q4_K", 4096, 4096), ("q4_K", 1024, 4096), ("q6_K", 1024, 4096),
                                     ("q8_0", 300, 2048), ("q5_K", 520, 1024), ("tq4_1s", 256, 3584)])
@pytest.mark.parametrize("t", [1, 3, 16, 24, 40, 512])
def test_fp16_activations_give_the_bits_of_their_fp32_widening(fmt, m, k, t):
    """mul_mat on a float16 x (NumPy, torch on torch's stream, eager and captured into a graph) gives the bits of
    mul_mat on the same values as float32, on every route: the wgmma GEMMs read them as they are (a tensor map over
    x, in its natural K order) or permuted (permute_f16) — no conversion, no fixup —, the decode
    preps as they are (their _x16 builds), the others widened (convert_f32) — the same fp16 the float32 plan's
    convert_f16 makes, or the same fp32. An inf in x gives non-finite outputs in its token's row, as with float32."""
    import torch

    import ptxgen.runtime as r
    from ptxgen.testing.strategies import random_raw

    rng = np.random.default_rng(m + k + t)
    w = r.QuantTensor.from_raw(fmt, random_raw(fmt, m, k, rng), (m, k))
    x16 = (rng.standard_normal((t, k)) * 3).astype(np.float16)
    want = r.mul_mat(w, x16.astype(np.float32))
    np.testing.assert_array_equal(r.mul_mat(w, x16), want)
    xt = torch.from_numpy(x16).cuda()
    np.testing.assert_array_equal(r.mul_mat(w, xt).cpu().numpy(), want)
    np.testing.assert_array_equal(graph_replayed(w, xt), want)
    if t >= 40:  # sm_89's GEMMs (the fp16 mma.sync one reads it as it is)
        np.testing.assert_array_equal(r.mul_mat(w, x16, arch="sm_89"), r.mul_mat(w, x16.astype(np.float32), arch="sm_89"))
    if t <= 16:  # mode="fast" (the int8 lanes' Q8_1 prep on fp16 x: prep_q8_lanes_x16, prep_tq4_1s_q8_x16) and the
        # tensor-core GEMVs forced (their preps' _x16 twins: prep_mma_f16_x16, prep_tq4_1s_mma_x16)
        np.testing.assert_array_equal(r.mul_mat(w, x16, mode="fast"), r.mul_mat(w, x16.astype(np.float32), mode="fast"))
        with knobs.override(PTXGEN_Q4K_MMA="1", PTXGEN_TQ4_MMA="1"):
            np.testing.assert_array_equal(r.mul_mat(w, x16), r.mul_mat(w, x16.astype(np.float32)))
    x16[t - 1, 5] = np.inf
    got = r.mul_mat(w, x16)
    assert not np.isfinite(got[t - 1]).all() and np.isfinite(got[:t - 1]).all()


@pytest.mark.parametrize("m,k", [(18944, 3584), (3584, 18944), (2100, 1152), (1000, 384), (1, 128), (4096, 4096)])
def test_tq4_1s_product_table_gemv(m, k):
    """gemv_tq4_1s_xt_t1 (RULES.xtab_max_tokens raised; off by default): one
    launch on x unrotated, within 1e-5 of float64 with the lane GEMV's bar, outputs NaN-poisoned first,
    bit-identical run to run and from an fp16 x as
    from its fp32 widening; an inf in x makes every output non-finite, as on the lane GEMV (every row reads every
    block). GPU == emulator is test_gpu_emu_crosscheck's."""
    import ptxgen.runtime as r
    from ptxgen.testing.strategies import random_raw

    rng = np.random.default_rng(m + k)
    raw = random_raw("tq4_1s", m, k, rng)  # (valid blocks of every bit pattern, finite scales; no quantizer)
    w = r.QuantTensor.from_raw("tq4_1s", raw, (m, k))
    x = rng.standard_normal((1, k)).astype(np.float32)
    want = formats.gemv_tq4_1s_ref(raw, m, k, x)
    with tuning.override(xtab_max_tokens={"tq4_1s": 1}):
        assert r.mul_mat_plan(w, 1).kernels == ["gemv_tq4_1s_xt_t1"]
        out = r.DeviceArray.empty((1, m), np.float32)
        out.owner.fill_bytes(0xFF)
        r.mul_mat(w, x, out=out)
        got = out.numpy()
        assert np.isfinite(got).all() and rel(got, want) <= 1e-5, rel(got, want)
        np.testing.assert_array_equal(r.mul_mat(w, x), got)
        h = x.astype(np.float16)
        np.testing.assert_array_equal(r.mul_mat(w, h), r.mul_mat(w, h.astype(np.float32)))
        bad = x.copy()
        bad[0, k // 2] = np.inf
        assert not np.isfinite(r.mul_mat(w, bad)).any()
    assert not np.isfinite(r.mul_mat(w, bad)).any()  # (the lane GEMV's)
