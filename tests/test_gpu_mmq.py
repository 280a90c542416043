"""L3: the Q4_K prefill GEMM on the GPU against the float64 reference, both lowerings: the fp16 mma.sync
path (sm_89 PTX, compiled for the device) and, on sm_90 devices, the wgmma + TMA path (sm_90a PTX)."""
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ptxgen import formats, knobs, tuning
from ptxgen.testing import strategies as S
from conftest import graph_replayed, rel, rel_ref

pytestmark = pytest.mark.gpu


def paths():
    import ptxgen.runtime as r

    return ["mma.sync", "wgmma"] if r.current().sm == 90 else ["mma.sync"]


def run_mmq(r, raw, m, k, x, bn, path="mma.sync", fmt="q4_K"):
    """mmq_launch with token tile `bn` on `path` (NaN-poisoned y): (y, overflow flag); the queue must be back at
    zero."""
    from ptxgen.runtime import ops

    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    t = x.shape[0]
    out = r.DeviceArray.empty((t, m), np.float32)
    out.owner.fill_bytes(0xFF)  # NaN poison
    flag = r.DeviceArray.empty((1,), np.uint32)
    flag.owner.fill_bytes(0)
    ops.mmq_launch(w, r.as_device_array(x), out, t, flag, arch=None if path.startswith("wgmma") else "sm_89", bn=bn,
                   path=path)
    assert not ops.workspace_state().any(), "a kernel left the workspace's queue, counters or x-ready counts set"
    return out.numpy(), int(flag.numpy()[0])


@settings(max_examples=40)
@given(data=st.data())
def test_mmq_kernel_matches_reference(data):
    import ptxgen.runtime as r

    m = data.draw(st.sampled_from([127, 128, 129, 300, 4096]))
    t = data.draw(st.sampled_from([16, 63, 64, 65, 200, 512]))
    k = data.draw(st.sampled_from([256, 512, 4096]))
    bn = data.draw(st.sampled_from([32, 64, 128]))
    path = data.draw(st.sampled_from(paths()))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    if data.draw(st.booleans()):
        raw = data.draw(S.raw_matrix("q4_K", m, k, max_abs_scale=2.0))  # any bytes; products stay in fp16
    else:
        raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    got, flag = run_mmq(r, raw, m, k, x, bn, path)
    want = formats.gemm_ref("q4_K", raw, m, k, x)
    assert flag == 0 and np.isfinite(got).all()
    assert rel(got, want) <= 1e-3


def _codec_weights(fmt, m, k, data, rng):
    """Drawn raw blocks (any bytes; scales up to strategies.fp16_weight_scale, the largest whose weights all fit the
    GEMMs' fp16) or, as often, quantized weights (a quantized block of up to 128 rows repeated: the quantizer takes
    seconds a million weights)."""
    if data.draw(st.booleans()):
        return data.draw(S.raw_matrix(fmt, m, k, max_abs_scale=S.fp16_weight_scale(fmt)))
    rows = min(m, 128)
    raw = formats.quantize(fmt, rng.standard_normal((rows, k)).astype(np.float32))
    return np.tile(raw, (-(-m // rows), 1))[:m]


CODEC_TILES = {"mma.sync": (32, 64, 128), "wgmma_ra": (64, 128, 256), "wgmma_pre": (256,)}


@pytest.mark.parametrize("fmt", ["q5_K", "q6_K", "q8_0"])
@settings(max_examples=20)
@given(data=st.data())
def test_codec_mmq_kernels_match_reference_on_raw_blocks(fmt, data):
    """Q5_K's, Q6_K's and Q8_0's GEMMs as test_mmq_kernel_matches_reference runs Q4_K's (mmq_launch, no fixup): the
    fp16 mma.sync build (sm_89's PTX) and, on sm_90, the register-A build (Q6_K: K a multiple of 2048, its raw rows
    by TMA) and the prepared one (dequantize_<fmt>_frags first), each token tile, on drawn raw blocks or quantized
    weights (_codec_weights): within 1e-3 of float64, the overflow flag down, outputs NaN-poisoned first."""
    import ptxgen.runtime as r

    path = data.draw(st.sampled_from(["mma.sync"] + (["wgmma_ra", "wgmma_pre"] if r.current().sm == 90 else [])))
    m = data.draw(st.sampled_from([127, 128, 129, 300, 1024]))
    t = data.draw(st.sampled_from([16, 63, 64, 65, 200, 512]))
    k = data.draw(st.sampled_from([2048, 4096] if (fmt, path) == ("q6_K", "wgmma_ra") else [256, 512, 4096]))
    bn = data.draw(st.sampled_from(CODEC_TILES[path]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    raw = _codec_weights(fmt, m, k, data, rng)
    x = rng.standard_normal((t, k)).astype(np.float32)
    got, flag = run_mmq(r, raw, m, k, x, bn, path, fmt)
    want = formats.gemm_ref(fmt, raw, m, k, x)
    assert flag == 0 and np.isfinite(got).all()
    if np.linalg.norm(want) > 0:
        assert rel(got, want) <= 1e-3


@pytest.mark.parametrize("fmt", ["q5_K", "q6_K", "q8_0"])
@settings(max_examples=20)
@given(data=st.data())
def test_codec_mul_mat_past_decode_matches_reference_on_raw_blocks(fmt, data):
    """mul_mat(mode="exact") of Q5_K, Q6_K and Q8_0 at skinny and prefill T (9-512) on drawn raw blocks or quantized
    weights (_codec_weights), by the route the rule picks (sm_90: Q5_K's 16-token and skinny builds, the register-A
    GEMM, the prepared one where the rule takes it), the prepared route ruled in (codec_ra_mmq_min_tokens past T),
    or the mma.sync GEMM (arch="sm_89"), each with the codec's fixup behind it: within 1e-3 of float64 where the plan
    ran an fp16 GEMM, 1e-5 where only exact GEMVs did (M under a tile), outputs NaN-poisoned first, the same bits
    run to run."""
    import ptxgen.runtime as r

    route = data.draw(st.sampled_from(["rule", "prepared", "sm_89"]))
    m = data.draw(st.sampled_from([1, 127, 128, 129, 300, 1024]))
    t = data.draw(st.sampled_from([9, 16, 17, 33, 64, 65, 200, 512]))
    k = data.draw(st.sampled_from([256, 512, 2048, 4096]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    raw = _codec_weights(fmt, m, k, data, rng)
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    arch = "sm_89" if route == "sm_89" else None
    rules = {"codec_ra_mmq_min_tokens": 1 << 30} if route == "prepared" else {}
    with tuning.override(**rules):
        out = r.DeviceArray.empty((t, m), np.float32)
        out.owner.fill_bytes(0xFF)  # NaN poison
        r.mul_mat(w, x, out=out, arch=arch)
        got = out.numpy()
        fp16 = any(n.startswith("mmq_") or "t16h" in n for n in r.mul_mat_plan(w, t, arch=arch).kernels)
        np.testing.assert_array_equal(r.mul_mat(w, x, arch=arch).view(np.uint32), got.view(np.uint32))
    assert np.isfinite(got).all()
    assert rel_ref(got, fmt, raw, m, k, x) <= (1e-3 if fp16 else 1e-5)  # (M = 1: the products' scale, accuracy.py)


@pytest.mark.parametrize("arch", [None, "sm_89"])  # None: what mul_mat picks (wgmma on sm_90); sm_89: mma.sync
@pytest.mark.parametrize("m", [1, 127, 128, 129, 4096])
@pytest.mark.parametrize("t", [1, 7, 16, 63, 64, 65, 200, 512])
def test_mul_mat_q4_k_all_shapes(m, t, arch):
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    k = 512 if m == 4096 else 4096
    rng = np.random.default_rng(m * 1000 + t)
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    got = r.mul_mat(r.QuantTensor.from_raw("q4_K", raw, (m, k)), x, arch=arch)
    want = formats.gemm_ref("q4_K", raw, m, k, x)
    # exact (fp32 activations) in the GEMVs: T <= 8, M < 128 past 16 tokens; 9-16 tokens run the fp16 skinny GEMM
    # gemv_q4_k_mma_t16h where it is built (else the exact gemv_q4_k_mma_n16)
    t16h = 9 <= t <= 16 and ops._t16h_ok("q4_K", arch)
    exact = not t16h and (t <= 8 or m < 128 or (t <= 16 and ops._mma_build(arch, "gemv_q4_k_mma_n16")))
    assert rel(got, want) <= (1e-5 if exact else 1e-3)


@pytest.mark.parametrize("arch", [None, "sm_89"])
def test_split_k_path_is_correct_and_deterministic(arch):
    import ptxgen.runtime as r
    from ptxgen.runtime.ops import splitk_plan_one_round

    assert splitk_plan_one_round(32, 224, 264)[0] > 1  # M=4096, T=16, K=14336: 32 tiles must split
    rng = np.random.default_rng(9)
    m, k, t = 512, 8192, 20
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    a = r.mul_mat(w, x, arch=arch)
    assert rel_ref(a, "q4_K", raw, m, k, x) <= 1e-3
    for _ in range(3):
        np.testing.assert_array_equal(r.mul_mat(w, x, arch=arch).view(np.uint32), a.view(np.uint32))


@pytest.mark.parametrize("path", ["mma.sync", "mma.sync_x16"])
@pytest.mark.parametrize("bn,m,k,t", [(32, 2048, 2048, 832), (64, 1024, 2048, 2240), (128, 2048, 2048, 1152),
                                      (128, 1920, 4096, 128)])
def test_mma_sync_mmq_whole_tiles_then_split_tail(bn, m, k, t, path):
    """The mma.sync MMQ's queue plan on this GPU (x converted inside the GEMM, or by convert_f16 first): whole
    tiles, then the last partial round's tiles split in K (or, with fewer tiles than resident CTAs, every tile
    split unevenly): correct against the float64 reference, the split counters back at zero, bit-identical run
    to run."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    fn = r.load(f"mmq_q4_k_f16_n{bn}", arch="sm_89")
    tiles = -(-t // bn) * -(-m // 128)
    whole, splits, per = ops.splitk_plan_tail(tiles, k // 64, fn.resident_per_sm() * r.current().sm_count)
    assert splits > 1 and whole < tiles  # the case exercises the split tail
    rng = np.random.default_rng(bn + t)
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    a, flag = run_mmq(r, raw, m, k, x, bn, path)
    assert flag == 0 and rel_ref(a, "q4_K", raw, m, k, x) <= 1e-3
    assert not ops.workspace_state().any(), "split counters left raised"
    for _ in range(2):
        b, _ = run_mmq(r, raw, m, k, x, bn, path)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("path", ["mma.sync", "mma.sync_x16"])
def test_mma_sync_mmq_spread_fixup_gives_the_last_ctas_bits(path, monkeypatch):
    """4096 x 1024 at T = 128: 32 tiles split 4 ways fill one round, so each split sums its own rows
    (ops.mmq_spread_fixup): correct, counters back at zero, and bit-identical to the tile's last CTA summing all
    (MMQ_SPREAD_MAX_SPLITS = 0) and to itself run again."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    m, k, t = 4096, 1024, 128
    plan = ops.mmq_plan(r.load("mmq_q4_k_f16_n128", arch="sm_89"), m, k, t, 128, True, r.current().sm_count)
    assert plan.splits > 1 and plan.spread, plan
    rng = np.random.default_rng(11)
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    a, flag = run_mmq(r, raw, m, k, x, 128, path)
    assert flag == 0 and rel_ref(a, "q4_K", raw, m, k, x) <= 1e-3
    assert not ops.workspace_state().any(), "split counters left raised"
    b, _ = run_mmq(r, raw, m, k, x, 128, path)
    tuning.set(mmq_spread_max_splits=0)
    c, _ = run_mmq(r, raw, m, k, x, 128, path)
    for other in (b, c):
        np.testing.assert_array_equal(a.view(np.uint32), other.view(np.uint32))


@pytest.mark.parametrize("path", ["mma.sync", "mma.sync_x16", "wgmma", "wgmma_ra", "wgmma_ra_cx", "wgmma_ra_x16",
                                  "wgmma_pre", "wgmma_pre_cx", "wgmma_pre_x16"])
def test_mmq_is_deterministic_and_fp16_overflow_is_recomputed_exactly(path):
    """wgmma_ra at T = 200: the path mul_mat itself takes there on an sm_90 device (its rule picks the build that
    converts x itself or the one after convert_f16_perm; both are forced too). mma.sync_x16 / wgmma_ra_x16: the
    flag comes from convert_f16; wgmma_ra_cx: from the GEMM's own converters."""
    import ptxgen.runtime as r

    if path.startswith("wgmma") and r.current().sm != 90:
        pytest.skip("the wgmma paths need an sm_90 device")
    arch = None if path.startswith("wgmma") else "sm_89"

    rng = np.random.default_rng(5)
    m, k, t, bn = (256, 1024, 200, 256) if path.startswith(("wgmma_ra", "wgmma_pre")) else (256, 1024, 100, 128)
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    a, _ = run_mmq(r, raw, m, k, x, bn, path)
    for _ in range(3):
        b, _ = run_mmq(r, raw, m, k, x, bn, path)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    x[3, 17] = 1e6  # overflows fp16
    _, flag = run_mmq(r, raw, m, k, x, bn, path)
    assert flag == 1
    got = r.mul_mat(r.QuantTensor.from_raw("q4_K", raw, (m, k)), x, arch=arch)
    want = formats.gemm_ref("q4_K", raw, m, k, x)
    assert rel(got[3], want[3]) <= 1e-5  # the overflowing token: recomputed exactly on the device
    assert rel(np.delete(got, 3, axis=0), np.delete(want, 3, axis=0)) <= 1e-3  # the others: the GEMM's fp16 bound
    from ptxgen.runtime import ops

    assert not ops.workspace_state().any(), "mul_mat left the overflow flag (or a counter) raised for the next call"
    x[5, 3] = np.nan
    got = r.mul_mat(r.QuantTensor.from_raw("q4_K", raw, (m, k)), x, arch=arch)
    assert np.isnan(got[5]).all() and np.isfinite(np.delete(got, 5, axis=0)).all()


def test_mul_mat_on_the_mma_sync_targets_converts_x_first_for_large_products():
    """mul_mat(arch="sm_89") from 2^31 multiply-adds (ops.RULES.mmq_x16_min_work) runs convert_f16 + mmq_q4_k_f16_n128_x16 (a launch of it is
    seen); correct against the float64 reference, and the same bits as calling that path directly."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    m, k, t = 4096, 4096, 256
    assert ops.mma_sync_x16(m, k, t, "sm_89")
    rng = np.random.default_rng(3)
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    got = r.mul_mat(w, x, arch="sm_89")
    launched = ops.mul_mat_plan(w, t, arch="sm_89").kernels  # the plan the call ran
    assert "mmq_q4_k_f16_n128_x16" in launched, launched
    assert rel_ref(got, "q4_K", raw, m, k, x) <= 1e-3
    direct, flag = run_mmq(r, raw, m, k, x, 128, "mma.sync_x16")
    assert flag == 0
    np.testing.assert_array_equal(direct.view(np.uint32), got.view(np.uint32))


@settings(max_examples=25)
@given(data=st.data())
def test_register_a_wgmma_mmq_matches_reference_and_is_deterministic(data):
    """The register-A wgmma MMQ (mmq_launch path "wgmma_ra": convert_f16_perm, then A dequantized into wgmma's
    registers; not chosen by mul_mat yet): within 1e-3 of the float64 reference on poisoned outputs, bit-identical
    when repeated, and the fp16 overflow of an activation flagged."""
    import ptxgen.runtime as r

    if r.current().sm != 90:
        pytest.skip("the wgmma path needs an sm_90 device")
    m = data.draw(st.sampled_from([1, 127, 128, 129, 300, 4096]))
    t = data.draw(st.sampled_from([1, 16, 63, 65, 192, 200, 512]))
    k = data.draw(st.sampled_from([256, 512, 4096]))
    bn = data.draw(st.sampled_from([64, 128, 192, 256]))  # n256: whole-program compile by the driver's JIT
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    got, flag = run_mmq(r, raw, m, k, x, bn, "wgmma_ra")
    assert flag == 0 and np.isfinite(got).all()
    assert rel_ref(got, "q4_K", raw, m, k, x) <= 1e-3
    again, _ = run_mmq(r, raw, m, k, x, bn, "wgmma_ra")
    np.testing.assert_array_equal(again.view(np.uint32), got.view(np.uint32))
    x[t // 2, k // 3] = 1e6  # overflows fp16: the flag tells mul_mat to recompute
    assert run_mmq(r, raw, m, k, x, bn, "wgmma_ra")[1] == 1


@settings(max_examples=25)
@given(data=st.data())
def test_register_a_mmq_converting_x_itself_gives_the_bits_of_the_build_after_convert_f16_perm(data):
    """mmq_q4_k_wgmma_ra_n*_cx (path "wgmma_ra_cx"): the producer warpgroup's idle warps convert fp32 x into the fp16
    copy the TMA thread reads, chunk by chunk behind x_ready counters, with no convert_f16_perm launch. Same
    conversion, same GEMM: bit for bit the output of "wgmma_ra_x16" on the same inputs (NaN-poisoned y), within
    1e-3 of the float64 reference, the x_ready counters and the queue back at zero (run_mmq), and an activation
    that overflows fp16 flagged."""
    import ptxgen.runtime as r

    if r.current().sm != 90:
        pytest.skip("the wgmma path needs an sm_90 device")
    m = data.draw(st.sampled_from([1, 127, 129, 300, 4096]))
    t = data.draw(st.sampled_from([1, 7, 65, 200, 512, 700]))
    k = data.draw(st.sampled_from([256, 512, 4096]))
    bn = data.draw(st.sampled_from([128, 256]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    got, flag = run_mmq(r, raw, m, k, x, bn, "wgmma_ra_cx")
    assert flag == 0 and np.isfinite(got).all()
    assert rel_ref(got, "q4_K", raw, m, k, x) <= 1e-3
    after, _ = run_mmq(r, raw, m, k, x, bn, "wgmma_ra_x16")
    np.testing.assert_array_equal(got.view(np.uint32), after.view(np.uint32))
    x[t - 1, k - 1] = -1e6  # overflows fp16
    assert run_mmq(r, raw, m, k, x, bn, "wgmma_ra_cx")[1] == 1


def test_register_a_mmq_converting_x_itself_on_a_full_grid_is_deterministic():
    """A large call (4096 x 4096 x 1024 tokens: every SM's CTA converts x while the others wait for its chunks, 16
    K chunks x 4 token tiles of x_ready counters): five runs bit-identical, the same bits as after convert_f16_perm,
    and mul_mat takes this build there (ops.mmq_convert_in_gemm: no K split)."""
    import ptxgen.runtime as r

    if r.current().sm != 90:
        pytest.skip("the wgmma path needs an sm_90 device")
    m, k, t = 4096, 4096, 1024
    rng = np.random.default_rng(11)
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    first, flag = run_mmq(r, raw, m, k, x, 256, "wgmma_ra_cx")
    assert flag == 0
    for _ in range(4):
        np.testing.assert_array_equal(run_mmq(r, raw, m, k, x, 256, "wgmma_ra_cx")[0].view(np.uint32),
                                      first.view(np.uint32))
    np.testing.assert_array_equal(run_mmq(r, raw, m, k, x, 256, "wgmma_ra_x16")[0].view(np.uint32),
                                  first.view(np.uint32))
    from ptxgen.runtime import ops

    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    got = r.mul_mat(w, x)
    launched = ops.mul_mat_plan(w, t).kernels
    assert "mmq_q4_k_wgmma_ra_n256_cx" in launched, launched
    np.testing.assert_array_equal(got.view(np.uint32), first.view(np.uint32))
    want = formats.gemm_ref("q4_K", raw, m, k, x)
    assert rel(got, want) <= 1e-3
    n192, flag = run_mmq(r, raw, m, k, x, 192, "wgmma_ra")  # no converting n192 build: the rule falls back
    assert flag == 0 and rel(n192, want) <= 1e-3


def test_convert_f16_kernel_is_bit_exact_and_flags_overflow():
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    x = np.random.default_rng(1).standard_normal((7, 512)).astype(np.float32) * 100
    flag = r.DeviceArray.empty((1,), np.uint32)
    flag.owner.fill_bytes(0)
    got = ops.convert_f16(x, flag).numpy()
    np.testing.assert_array_equal(got.view(np.uint16), x.astype(np.float16).view(np.uint16))
    assert int(flag.numpy()[0]) == 0
    x[6, 511] = -7e4
    ops.convert_f16(x, flag)
    assert int(flag.numpy()[0]) == 1


@settings(max_examples=20)
@given(data=st.data())
def test_prepared_mmq_matches_reference_and_its_fragments_are_the_numpy_models(data):
    """The prepared register-A MMQ (path "wgmma_pre": dequantize_q4_k_frags writes the fp16 A fragments, then
    mmq_q4_k_wgmma_pre_n256 loads them by TMA instead of dequantizing): the fragments bit for bit
    layouts.q4k_rega_fragments of gguf-exact weights rounded to fp16 (rows past M zero, every byte written over a
    0xFF poison); the product within 1e-3 of the float64 reference on NaN-poisoned y, bit-identical when repeated,
    and the converting build ("wgmma_pre_cx") gives the bits of the one after convert_f16_perm ("wgmma_pre_x16")."""
    import ptxgen.runtime as r
    from ptxgen import layouts

    if r.current().sm != 90:
        pytest.skip("the wgmma path needs an sm_90 device")
    m = data.draw(st.sampled_from([1, 127, 128, 129, 300, 4096]))
    t = data.draw(st.sampled_from([1, 65, 200, 256, 257, 600]))
    k = data.draw(st.sampled_from([256, 512, 4096]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    want_frags = layouts.q4k_prepared_fragments(raw, m, k)
    frags = r.DeviceArray.empty(want_frags.shape, np.uint8)
    frags.owner.fill_bytes(0xFF)
    r.load("dequantize_q4_k_frags", arch="sm_90a").launch((k // 64, -(-m // 128)),
                                                          (r.as_device_array(raw), frags, np.uint32(m), np.uint32(k)))
    np.testing.assert_array_equal(frags.numpy(), want_frags)
    x = rng.standard_normal((t, k)).astype(np.float32)
    got, flag = run_mmq(r, raw, m, k, x, 256, "wgmma_pre_x16")
    assert flag == 0 and np.isfinite(got).all()
    assert rel_ref(got, "q4_K", raw, m, k, x) <= 1e-3
    again, _ = run_mmq(r, raw, m, k, x, 256, "wgmma_pre_x16")
    np.testing.assert_array_equal(again.view(np.uint32), got.view(np.uint32))
    cx, flag = run_mmq(r, raw, m, k, x, 256, "wgmma_pre_cx")
    assert flag == 0
    np.testing.assert_array_equal(cx.view(np.uint32), got.view(np.uint32))


def test_mul_mat_runs_the_prepared_mmq_from_its_threshold():
    """mul_mat on an sm_90 device from ops.RULES.mmq_pre_min_tokens tokens launches dequantize_q4_k_frags and a prepared
    build, correct against the float64 reference and the same bits as that path called directly; with
    PTXGEN_MMQ_PRE=0 the register-A build instead."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    if r.current().sm != 90:
        pytest.skip("the prepared MMQ needs an sm_90 device")
    m, k, t = 256, 1024, ops.RULES.mmq_pre_min_tokens
    rng = np.random.default_rng(21)
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    got = r.mul_mat(w, x)
    launched = ops.mul_mat_plan(w, t).kernels + ["--"]  # the plans the calls ran
    with knobs.override(PTXGEN_MMQ_PRE="0"):  # restored (and the plans re-made) on leaving
        ra = r.mul_mat(w, x)
        launched += ops.mul_mat_plan(w, t).kernels
    cut = launched.index("--")
    assert "dequantize_q4_k_frags" in launched[:cut] and any("wgmma_pre_n256" in n for n in launched[:cut]), launched
    assert not any("frags" in n or "_pre_" in n for n in launched[cut:]), launched
    want = formats.gemm_ref("q4_K", raw, m, k, x)
    assert rel(got, want) <= 1e-3 and rel(ra, want) <= 1e-3
    direct, flag = run_mmq(r, raw, m, k, x, 256, "wgmma_pre")
    assert flag == 0
    np.testing.assert_array_equal(direct.view(np.uint32), got.view(np.uint32))


def test_mul_mat_picks_wgmma_on_sm90():
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    hopper = r.current().sm == 90
    assert ops.mmq_path() == ("wgmma" if hopper else "mma.sync")
    assert ops.mmq_path("sm_89") == "mma.sync"
    # from WGMMA_RA_MIN_TOKENS on, A from registers (n256); the knob moves or removes that threshold
    assert ops.mmq_path(t=ops.RULES.wgmma_ra_min_tokens) == ("wgmma_ra" if hopper else "mma.sync")
    assert ops.mmq_path(t=ops.RULES.wgmma_ra_min_tokens - 1) == ("wgmma" if hopper else "mma.sync")
    assert ops.mmq_path("sm_89", t=4096) == "mma.sync"
    with knobs.override(PTXGEN_MMQ_REGA="0"):
        assert ops.mmq_path(t=4096) == ("wgmma" if hopper else "mma.sync")
    with knobs.override(PTXGEN_MMQ_REGA="1"):
        assert ops.mmq_path(t=16) == ("wgmma_ra" if hopper else "mma.sync")
    # the prepared build from MMQ_PRE_MIN_TOKENS (PTXGEN_MMQ_PRE=1: wherever n256 runs, 0: never)
    assert ops.mmq_path(t=ops.RULES.mmq_pre_min_tokens) == ("wgmma_pre" if hopper else "mma.sync")
    assert ops.mmq_path(t=ops.RULES.mmq_pre_min_tokens - 1) == ("wgmma_ra" if hopper else "mma.sync")
    with knobs.override(PTXGEN_MMQ_PRE="1"):
        assert ops.mmq_path(t=ops.RULES.wgmma_ra_n128_max_tokens + 1) == ("wgmma_pre" if hopper else "mma.sync")
        assert ops.mmq_path(t=ops.RULES.wgmma_ra_n128_max_tokens) == ("wgmma_ra" if hopper else "mma.sync")
    with knobs.override(PTXGEN_MMQ_PRE="0"):
        assert ops.mmq_path(t=8192) == ("wgmma_ra" if hopper else "mma.sync")


# --- the Q8_1 (int8 mma.sync) MMQ: fused quantization ("q8") and quantize_q8_1 first ("q8_pre")

def run_q8(r, raw, m, k, x, bn, path="q8", splits_plan=True):
    from ptxgen.runtime import ops

    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    t = x.shape[0]
    out = r.DeviceArray.empty((t, m), np.float32)
    out.owner.fill_bytes(0xFF)  # NaN poison
    flag = r.DeviceArray.empty((1,), np.uint32)
    flag.owner.fill_bytes(0)
    ops.mmq_launch(w, r.as_device_array(x), out, t, flag, bn=bn, path=path)
    assert not ops.workspace_state().any(), "a kernel left the workspace's queue, counters or x-ready counts set"
    return out.numpy(), int(flag.numpy()[0])


@settings(max_examples=40)
@given(data=st.data())
def test_q8_mmq_matches_the_q8_1_reference(data):
    """Exact integer dots: within 1e-5 of the float64 product with the Q8_1-rounded activations, for raw
    (any-bit) and quantized weights, split-K included (the plan splits small grids)."""
    import ptxgen.runtime as r

    m = data.draw(st.sampled_from([1, 127, 128, 129, 300, 4096]))
    t = data.draw(st.sampled_from([1, 7, 16, 63, 64, 65, 200, 512]))
    k = data.draw(st.sampled_from([256, 512, 4096]))
    bn = data.draw(st.sampled_from([16, 32, 64]))
    path = data.draw(st.sampled_from(["q8", "q8_pre"]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    if data.draw(st.booleans()):
        raw = data.draw(S.raw_matrix("q4_K", m, k, max_abs_scale=2.0))
    else:
        raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = (rng.standard_normal((t, k)) * data.draw(st.sampled_from([1e-3, 1.0, 1e4]))).astype(np.float32)
    got, flag = run_q8(r, raw, m, k, x, bn, path)
    want = formats.gemm_q8_1_ref("q4_K", raw, m, k, x)
    assert flag == 0 and np.isfinite(got).all()
    assert rel(got, want) <= 1e-5


def test_q8_mmq_is_deterministic_propagates_nan_and_flags_scale_overflow():
    import ptxgen.runtime as r

    rng = np.random.default_rng(6)
    m, k, t = 4096, 4096, 48  # 32 x 2 tiles: split-K with the reduction
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    a, _ = run_q8(r, raw, m, k, x, 32)
    assert rel(a, formats.gemm_q8_1_ref("q4_K", raw, m, k, x)) <= 1e-5
    from ptxgen.runtime import ops
    assert not ops.workspace_state().any(), "the split-K fixup left a tile counter set"
    for _ in range(3):
        b, _ = run_q8(r, raw, m, k, x, 32)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    fused, _ = run_q8(r, raw, m, k, x, 64)  # n64: one CTA per SM either way, so the same split plan
    pre, _ = run_q8(r, raw, m, k, x, 64, "q8_pre")
    np.testing.assert_array_equal(fused.view(np.uint32), pre.view(np.uint32))  # same Q8_1 bits either way
    x[5, 3] = np.nan
    got, flag = run_q8(r, raw, m, k, x, 64)
    assert flag == 0 and np.isnan(got[5]).all() and np.isfinite(np.delete(got, 5, axis=0)).all()
    x[5, 3] = 0
    x[7, 100] = 1e10  # amax/127 > 65504: Q8_1 cannot hold this block's scale
    for path in ("q8", "q8_pre"):  # the fused GEMM or quantize_q8_1_mmq raises the flag
        _, flag = run_q8(r, raw, m, k, x, 32, path)
        assert flag == 1, path
    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    got = r.mul_mat(w, x, mode="fast")  # token 7 recomputed by the fixup in fp32: fp16 overflows too
    want = formats.gemm_ref("q4_K", raw, m, k, x)
    assert rel(got[7], want[7]) <= 1e-5
    rest = np.delete(got, 7, axis=0)
    if ops.q8_path(t, ops.mmq_path()):
        assert rel(rest, np.delete(formats.gemm_q8_1_ref("q4_K", raw, m, k, x), 7, axis=0)) <= 1e-5
    else:
        assert rel(rest, np.delete(want, 7, axis=0)) <= 1e-3


@pytest.mark.parametrize("t", [9, 16, 40, 64, 65, 200])
def test_mul_mat_fast_q4_k_prefill(t):
    """mode="fast" for T > 8: the Q8_1 MMQ up to Q8_MAX_TOKENS (Q8_1 reference, 1e-5), the fp16 GEMM above."""
    import ptxgen.runtime as r
    from ptxgen.runtime.ops import mmq_path, q8_path

    rng = np.random.default_rng(t)
    m, k = 384, 2048
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    got = r.mul_mat(r.QuantTensor.from_raw("q4_K", raw, (m, k)), x, mode="fast")
    if q8_path(t, mmq_path()):
        assert rel(got, formats.gemm_q8_1_ref("q4_K", raw, m, k, x)) <= 1e-5
    else:
        assert rel_ref(got, "q4_K", raw, m, k, x) <= 1e-3


@pytest.mark.parametrize("path,bn", [("wgmma", 32), ("wgmma", 256), ("wgmma_ra", 128), ("wgmma_ra", 256),
                                     ("wgmma_pre", 256)])
def test_wgmma_split_k_fixup_is_correct_and_deterministic(path, bn):
    """The wgmma builds' in-kernel split-K fixup (partials in fragment order, the last CTA of a tile sums them in z
    order): 10 tiles, partial in M and T, split 8 ways on the H200. Correct, bit-identical run to
    run although a different CTA may come last each time, and the tile counters are left at zero."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    if r.current().sm != 90:
        pytest.skip("the wgmma paths need an sm_90 device")
    rng = np.random.default_rng(11)
    m, k, t = 520, 4096, bn + 37
    tiles = ((m + 127) // 128) * ((t + bn - 1) // bn)
    assert ops.splitk_plan_one_round(tiles, k // 64, r.current().sm_count)[0] > 1
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    a, flag = run_mmq(r, raw, m, k, x, bn, path)
    assert flag == 0 and rel_ref(a, "q4_K", raw, m, k, x) <= 1e-3
    assert not ops.workspace_state().any(), "the split-K tile counters were not reset"
    for _ in range(3):
        np.testing.assert_array_equal(run_mmq(r, raw, m, k, x, bn, path)[0].view(np.uint32), a.view(np.uint32))


@pytest.mark.parametrize("fmt,m,k,t", [("q4_K", 5120, 4096, 512), ("q4_K", 14336, 4096, 512), ("q4_K", 9000, 4096, 128),
                                      ("q6_K", 3000, 2048, 512), ("q8_0", 9000, 3584, 512), ("q5_K", 9000, 2048, 512),
                                      ("tq4_1s", 18944, 3584, 512)])
def test_stream_k_register_a_gemm(fmt, m, k, t):
    """The register-A GEMM's stream-K builds (mmq_<fmt>_wgmma_ra_n{128,256}_sk; RULES.mmq_stream_k_min_gain raised,
    off until timed): every resident CTA the same K-steps of the tiles laid end to end, a tile cut by a CTA's
    boundary split-K over 2-3 CTAs (the last to count in sums the pieces in z order) — within 1e-3 of float64
    (outputs NaN-poisoned first; random valid blocks, no quantizer: these shapes are large), bit-identical run to
    run whichever CTA comes last, a token past fp16 recomputed exactly by the fixup, the stream's counters and queue
    back at zero; on 5120x4096 the forced path ("wgmma_ra_sk") against the uniform build."""
    from ptxgen.runtime import ops

    r, torch, raw, w, x = _register_a_case(fmt, m, k, t)
    x[t // 2, k // 3] = 7e4 if fmt != "tq4_1s" else 8e5  # past fp16 (after TQ4_1S's rotation): recomputed in fp32
    want = formats.gemv_tq4_1s_ref(raw, m, k, x) if fmt == "tq4_1s" else formats.gemm_ref(fmt, raw, m, k, x)
    with tuning.override(mmq_stream_k_min_gain=0.01, codec_ra_mmq_max_tokens=1 << 30, codec_few_max_tokens={}):
        assert any(n.endswith("_sk") for n in r.mul_mat_plan(w, t).kernels), r.mul_mat_plan(w, t).kernels
        xt = torch.from_numpy(x).cuda()
        y = torch.full((t, m), float("nan"), device="cuda")
        r.mul_mat(w, xt, out=y)
        got = y.cpu().numpy().astype(np.float64)
        ok = [i for i in range(t) if i != t // 2]
        assert np.isfinite(got).all()
        assert rel(got[ok], want[ok]) <= 1e-3
        assert rel(got[t // 2], want[t // 2]) <= (5e-5 if fmt == "tq4_1s" else 1e-5)
        assert np.array_equal(r.mul_mat(w, xt).cpu().numpy(), y.cpu().numpy())
        torch.cuda.synchronize()
        assert not ops.workspace_state(torch.cuda.current_stream()).any(), "counters or queue left set"
    if (fmt, m) == ("q4_K", 5120):  # the forced path, whatever the rule: the uniform build's result
        x[t // 2, k // 3] = 1.0
        a, fa = run_mmq(r, raw, m, k, x, 256, "wgmma_ra_sk")
        u, fu = run_mmq(r, raw, m, k, x, 256, "wgmma_ra")
        assert fa == fu == 0 and rel(a, u) <= 3e-5 and rel_ref(a, fmt, raw, m, k, x) <= 1e-3


def _register_a_case(fmt, m, k, t):
    """(ptxgen.runtime, torch, raw blocks, QuantTensor, fp32 x) for a register-A GEMM test of shape (m, k) at T = t:
    random valid blocks (no quantizer: these shapes are large) and x seeded by the shape; skipped off sm_90."""
    import torch

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the register-A GEMMs are sm_90a's")
    import ptxgen.runtime as r
    from ptxgen.testing.strategies import random_raw

    rng = np.random.default_rng(m + t)
    raw = random_raw(fmt, m, k, rng)
    return r, torch, raw, r.QuantTensor.from_raw(fmt, raw, (m, k)), rng.standard_normal((t, k)).astype(np.float32)


@pytest.mark.parametrize("fmt,m,k,t", [("q4_K", 1024, 4096, 512), ("q4_K", 4096, 4096, 512), ("q6_K", 1024, 4096, 512),
                                       ("q6_K", 4096, 4096, 512), ("q4_K", 1000, 4096, 512), ("q4_K", 3584, 3584, 128)])
def test_cluster_split_gemm_gives_the_split_builds_bits(fmt, m, k, t):
    """mul_mat's cluster split-K builds (mmq_<fmt>_wgmma_ra_n{64,128,256}_cs, RULES.mmq_cluster_split_max_splits: a
    tile's K splits one cluster's CTAs, summed through distributed shared memory) at T = 512 (M not a multiple of
    128 too) and on n64 tiles (3584x3584 at T = 128): the bits of the split build (the rule at 0: partials in global
    memory, the last CTA's fixup), within 1e-3 of float64 (outputs NaN-poisoned first), run after run and replayed
    in a CUDA graph, on fp32 and fp16 x; the stream's counters and queue untouched."""
    from ptxgen.runtime import ops

    r, torch, raw, w, x = _register_a_case(fmt, m, k, t)
    with tuning.override(mmq_cluster_split_max_splits=4):  # (2 as shipped: the 4-split plans run where the GPU holds them)
        plan = r.mul_mat_plan(w, t).kernels
        if not any(n.endswith("_cs") for n in plan):  # (a GPU holding fewer clusters than the tiles: the split build)
            pytest.skip(f"this GPU's plan: {plan}")
        _cluster_split_checks(r, ops, torch, fmt, raw, w, x, m, k, t)


def _cluster_split_checks(r, ops, torch, fmt, raw, w, x, m, k, t):
    xt = torch.from_numpy(x).cuda()
    y = torch.full((t, m), float("nan"), device="cuda")
    r.mul_mat(w, xt, out=y)
    got = y.cpu().numpy()
    assert np.isfinite(got).all() and rel(got.astype(np.float64), formats.gemm_ref(fmt, raw, m, k, x)) <= 1e-3
    with tuning.override(mmq_cluster_split_max_splits=0):
        assert not any(n.endswith("_cs") for n in r.mul_mat_plan(w, t).kernels)
        np.testing.assert_array_equal(r.mul_mat(w, xt).cpu().numpy().view(np.uint32), got.view(np.uint32))
    np.testing.assert_array_equal(r.mul_mat(w, xt).cpu().numpy().view(np.uint32), got.view(np.uint32))
    x16 = xt.half()
    h = r.mul_mat(w, x16).cpu().numpy()
    np.testing.assert_array_equal(h.view(np.uint32), r.mul_mat(w, x16.float()).cpu().numpy().view(np.uint32))
    np.testing.assert_array_equal(graph_replayed(w, xt).view(np.uint32), got.view(np.uint32))
    assert not ops.workspace_state(torch.cuda.current_stream()).any(), "counters or queue left set"


@pytest.mark.parametrize("bn", [128, 256])
def test_wgmma_cluster_multicast_mmq(bn):
    """mmq_launch path "wgmma_ra_mc": the register-A MMQ in clusters of 2 CTAs multicasting each activation tile
    (launched with cluster dims (2, 1, 1)). An odd number of M-tiles (the last cluster's rank 1 past M), partial
    token tiles, and K long enough to split: within 1e-3 of the float64 reference, the queue untouched, the
    split-K counters back at zero, bit-identical run to run."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    if r.current().sm != 90:
        pytest.skip("the wgmma paths need an sm_90 device")
    rng = np.random.default_rng(13)
    m, k, t = 2 * 128 + 5, 4096, bn + 37  # 3 M-tiles: the second cluster's rank 1 lies past M
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    a, flag = run_mmq(r, raw, m, k, x, bn, "wgmma_ra_mc")
    assert flag == 0 and rel_ref(a, "q4_K", raw, m, k, x) <= 1e-3
    assert not ops.workspace_state().any(), "the split-K tile counters were not reset"
    for _ in range(3):
        np.testing.assert_array_equal(run_mmq(r, raw, m, k, x, bn, "wgmma_ra_mc")[0].view(np.uint32), a.view(np.uint32))


@pytest.mark.parametrize("m,k,t,arch", [(129, 768, 5, None), (300, 4096, 32, None), (520, 2048, 45, None),
                                        (1, 512, 64, None), (300, 4096, 40, "sm_89"), (4096, 1024, 33, None)])
def test_register_a_skinny_gemm(m, k, t, arch):
    """mmq_q4_k_rega_n32 (prep_q4k_t32h per group of 32 tokens; the CTA's warps share the records' ring, A decoded
    in registers), also its sm_89 build compiled for this GPU: within 1e-3 of the float64 reference (~2e-4
    expected) with outputs NaN-poisoned first, over 1-2 token groups, with and without K splits; bit-identical run
    to run; an inf or a NaN in the last token's x makes that token's outputs non-finite and leaves the others
    finite."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    rng = np.random.default_rng(m + k + t)
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    x = (rng.standard_normal((t, k)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)

    plan = ops.recorded_plan(w, t, lambda pb: ops._skinny_gemm(pb, w, pb.y.ptr, m, k, t, arch))

    def run(xv):
        xa = r.as_device_array(xv, "x", np.float32, ndim=2)
        out = r.DeviceArray.empty((t, m), np.float32)
        out.owner.fill_bytes(0xFF)
        ops.run_plan(plan, xa.ptr, out.ptr)
        return out.numpy()

    got = run(x)
    want = formats.gemm_ref("q4_K", raw, m, k, x)
    assert np.isfinite(got).all() and rel(got, want) <= 1e-3, rel(got, want)
    for _ in range(2):
        np.testing.assert_array_equal(run(x).view(np.uint32), got.view(np.uint32))
    for bad in (np.inf, np.nan):
        xb = x.copy()
        xb[t - 1, k // 3] = bad
        yb = run(xb)
        assert not np.isfinite(yb[t - 1]).any() and np.isfinite(yb[:t - 1]).all()
    if arch == "sm_89" and 16 < t <= ops.RULES.skinny_max_tokens["mma.sync"] and m >= ops.RULES.mmq_min_rows:
        # mul_mat on the mma.sync targets takes this kernel at these T: the same bits
        np.testing.assert_array_equal(r.mul_mat(w, x, arch=arch).view(np.uint32), got.view(np.uint32))


def test_mma_sync_mmq_item_raster_on_the_gpu():
    """The mma.sync MMQ's item raster where it bands (K = 14336: bands of 3 token tiles of 128, 7 tiles, the last
    band partial): mul_mat on the mma.sync lowering within 1e-3 of the float64 reference, outputs NaN-poisoned
    first, bit-identical run to run."""
    import ptxgen.runtime as r
    from ptxgen.kernels import mmq

    m, k, t = 256, 14336, 800
    gt = max(1, mmq.RASTER_BYTES // (4 * 128) // k)
    assert -(-t // 128) > 2 * gt  # the order is banded here
    rng = np.random.default_rng(21)
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    out = r.DeviceArray.empty((t, m), np.float32)
    out.owner.fill_bytes(0xFF)
    r.mul_mat(w, x, out=out, arch="sm_89")
    got = out.numpy()
    assert np.isfinite(got).all() and rel_ref(got, "q4_K", raw, m, k, x) <= 1e-3
    np.testing.assert_array_equal(r.mul_mat(w, x, arch="sm_89").view(np.uint32), got.view(np.uint32))


def _codec_prefill(fmt, m, k, t, first, arch=None):
    """mul_mat (on the target `arch` pins, else the device's) whose plan has `first` among its first two launches:
    within the fp16 GEMMs' bound of the float64 reference (outputs NaN-poisoned first), bit-identical run to run; a
    token with a value past fp16 comes back recomputed exactly (the codec's fixup). Q5_K's few-token builds, which
    take its calls to 32 tokens on the H200, are off here (test_gpu_gemv tests them)."""
    with tuning.override(codec_few_max_tokens={"q5_K": 0}):
        _codec_prefill_checks(fmt, m, k, t, first, arch)


def _codec_prefill_checks(fmt, m, k, t, first, arch):
    import torch

    import ptxgen.runtime as r

    rng = np.random.default_rng(m + t)
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    x[t // 2, k // 3] = 7e4 if fmt != "tq4_1s" else 8e5  # past fp16 (after TQ4_1S's rotation): recomputed in fp32
    assert first in r.mul_mat_plan(w, t, arch=arch).kernels[:2]  # TQ4_1S: after its rotation
    xt = torch.from_numpy(x).cuda()
    y = torch.full((t, m), float("nan"), device="cuda")
    r.mul_mat(w, xt, out=y, arch=arch)
    got = y.cpu().numpy().astype(np.float64)
    want = formats.gemv_tq4_1s_ref(raw, m, k, x) if fmt == "tq4_1s" else formats.gemm_ref(fmt, raw, m, k, x)
    ok = [i for i in range(t) if i != t // 2]
    assert np.isfinite(got).all()
    assert np.linalg.norm(got[ok] - want[ok]) / np.linalg.norm(want[ok]) <= 1e-3
    bound = 5e-5 if fmt == "tq4_1s" else 1e-5  # (the rotated outlier's cancellation, as the emulator harness says)
    assert np.linalg.norm(got[t // 2] - want[t // 2]) / np.linalg.norm(want[t // 2]) <= bound
    assert np.array_equal(r.mul_mat(w, xt, arch=arch).cpu().numpy(), y.cpu().numpy())


@pytest.mark.parametrize("fmt", ["q5_K", "q6_K", "q8_0", "tq4_1s"])
@pytest.mark.parametrize("m,k,t", [(300, 1024, 17), (4096, 4096, 512), (1000, 3584, 100), (520, 2048, 1100)])
def test_codec_mma_sync_gemm(fmt, m, k, t):
    """Q5_K, Q6_K, Q8_0 and TQ4_1S prefill on the mma.sync targets (sm_89's PTX here; sm_120a's is the same cp.async
    build): the fp16 mma.sync MMQ decoding the codec's blocks with its run8 (mmq_<fmt>_f16_n<tile>, after
    convert_f16 for large products; TQ4_1S on its x rotated once first), then the codec's fixup — _codec_prefill's
    checks."""
    tile = 32 if t <= 32 else 64 if t <= 64 else 128
    first = f"mmq_{fmt.lower()}_f16_n{tile}" + ("_x16" if m * k * t >= 1 << 31 else "")
    if fmt == "tq4_1s":
        from ptxgen.runtime import ops

        kernels = ops.mul_mat_plan(r_weights(fmt, m, k), t, arch="sm_89").kernels
        assert first in kernels
        first = kernels[0]  # rotate_tq4_1s, or rotate_tq4_1s_f16 where the GEMM reads convert_f16's copy
        assert first == "rotate_tq4_1s" + ("_f16" if kernels[1].endswith("_x16") else "")
    _codec_prefill(fmt, m, k, t, first, arch="sm_89")


@pytest.mark.parametrize("fmt", ["q5_K", "q6_K", "q8_0", "tq4_1s"])
@pytest.mark.parametrize("m,k,t", [(300, 1024, 17), (4096, 4096, 512), (1000, 3584, 1100)])
def test_prepared_gemm_of_the_other_formats(fmt, m, k, t):
    """Q5_K, Q6_K, Q8_0 and TQ4_1S prefill on sm_90 by the prepared route (Q5_K's and Q8_0's register-A GEMMs ruled
    out, the f16a GEMM too: rule mmq_f16a off): dequantize_<fmt>_frags, the prepared register-A GEMM, the codec's
    fixup (_codec_prefill's checks)."""
    import torch

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the prepared GEMM is sm_90a's")
    from ptxgen.runtime import ops

    t = max(t, ops.RULES.codec_mmq_min_tokens[fmt])  # TQ4_1S's tensor-core GEMV runs below its 40
    with tuning.override(codec_ra_mmq_min_tokens=1 << 30, mmq_f16a=False):
        _codec_prefill(fmt, m, k, t, f"dequantize_{fmt.lower()}_frags")


F16A_RULES = dict(mmq_f16a=True, mmq_pre_min_tokens=1, codec_mmq_min_tokens={"q5_K": 9, "q6_K": 9, "q8_0": 9},
                 codec_ra_mmq_max_tokens={"q5_K": 8, "q6_K": 8, "q8_0": 8, "tq4_1s": 1 << 30})


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0"])
@pytest.mark.parametrize("m,k,t", [(300, 1024, 300), (1000, 3584, 2100)])
def test_f16a_gemm(fmt, m, k, t):
    """The f16a GEMM (rule mmq_f16a, kernels/mmq.py F16A_NOTE) where the prepared route runs, every format:
    dequantize_<fmt> into fp16 rows, then on fp32 x convert_f16 + mmq_q4_k_wgmma_f16a_n256 (T = 300) or the _cx
    build converting x inside (T = 2100), on fp16 x _n256 on x as given; the codec's fixup — _codec_prefill's
    checks, and on fp16 x the bits of the same values as fp32."""
    import torch

    import ptxgen.runtime as r

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the f16a GEMM is sm_90a's")
    with tuning.override(**F16A_RULES):
        _codec_prefill(fmt, m, k, t, f"dequantize_{fmt.lower()}")
        rng = np.random.default_rng(t)
        w = r.QuantTensor.from_raw(fmt, formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32)), (m, k))
        x16 = torch.from_numpy(rng.standard_normal((t, k)).astype(np.float16)).cuda()
        assert "mmq_q4_k_wgmma_f16a_n256" in r.mul_mat_plan(w, t, x_dtype="float16").kernels
        np.testing.assert_array_equal(r.mul_mat(w, x16).cpu().numpy(), r.mul_mat(w, x16.float()).cpu().numpy())


@pytest.mark.parametrize("fmt", ["q5_K", "q8_0", "q6_K"])
@pytest.mark.parametrize("m,k,t", [(300, 1024, 9), (4096, 4096, 512), (1000, 3584, 1100)])
def test_codec_register_a_gemm(fmt, m, k, t):
    """Q5_K, Q8_0 and Q6_K from 9 tokens on sm_90 by their register-A GEMMs (blocks decoded in the K loop from the raw
    rows by TMA): convert_f16_perm, mmq_<fmt>_wgmma_ra_n<tile>, the fixup (_codec_prefill's checks); T = 1100 past
    Q6_K's codec_ra_mmq_max_tokens with that rule lifted. Q6_K on K whose rows are 16-byte multiples (2048, 14336)."""
    import torch

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the register-A GEMMs are sm_90a's")
    from ptxgen.runtime import ops

    if fmt == "q6_K":
        k = {1024: 2048, 3584: 14336}.get(k, k)
    with tuning.override(codec_ra_mmq_max_tokens=1 << 30):
        first = f"mmq_{fmt.lower()}_wgmma_ra_n{64 if t <= 64 else 256}"
        kernels = ops.mul_mat_plan(r_weights(fmt, m, k), t).kernels
        first += next((s for s in ("_cx", "_cs") if first + s in kernels), "")  # its rules: mmq_cx_min_tokens,
        _codec_prefill(fmt, m, k, t, first)  # mmq_cluster_split_max_splits (Q6_K's split tiles)


@pytest.mark.parametrize("m,k,t", [(1000, 3584, 17), (3584, 18944, 512), (520, 1280, 100), (1032, 3584, 1024),
                                   (264, 768, 300)])
def test_q6_k_register_a_gemm_on_rows_of_any_length(m, k, t):
    """Q6_K where K is not a multiple of 2048 (its 210-byte blocks leave rows short of 16-byte multiples; Qwen's 3584
    and 18944): the register-A GEMM reading rows in groups of 8 (mmq_q6_k_wgmma_ra_n<tile>_g8, kernels/mmq.py
    ROW_GROUP_NOTE) — _codec_prefill's checks, on one K split and on the cluster split build where its rule splits
    (3584x18944 T = 512, 264x768); an fp16 x gets the bits of its fp32 widening."""
    import torch

    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the register-A GEMMs are sm_90a's")
    with tuning.override(codec_ra_mmq_max_tokens=1 << 30):
        kernels = ops.mul_mat_plan(r_weights("q6_K", m, k), t).kernels
        first = next(n for n in kernels if n.startswith("mmq_"))
        assert re.fullmatch(r"mmq_q6_k_wgmma_ra_n(64|128|256)_g8(_cs)?", first), kernels
        _codec_prefill("q6_K", m, k, t, first)
        rng = np.random.default_rng(k)
        w = r.QuantTensor.from_raw("q6_K", formats.quantize("q6_K", rng.standard_normal((m, k)).astype(np.float32)),
                                   (m, k))
        x16 = torch.from_numpy(rng.standard_normal((t, k)).astype(np.float16)).cuda()
        np.testing.assert_array_equal(r.mul_mat(w, x16).cpu().numpy(), r.mul_mat(w, x16.float()).cpu().numpy())


@pytest.mark.parametrize("m,k,t", [(300, 3584, 40), (4096, 3584, 512), (1000, 18944, 100), (256, 1024, 1100)])
def test_tq4_1s_register_a_gemm(m, k, t):
    """TQ4_1S's register-A GEMM (codecs.tq4_1s.ra_fragments; from RULES.codec_ra_mmq_min_tokens, 17 on the H200):
    x rotated once, convert_f16_perm, mmq_tq4_1s_wgmma_ra_n<tile> decoding the blocks in its K loop, the fixup
    on the rotated x — _codec_prefill's checks (1e-3 of float64, bit-identical run to run, a token past fp16
    recomputed exactly)."""
    import torch

    from ptxgen.runtime import ops

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the register-A GEMMs are sm_90a's")
    kernels = ops.mul_mat_plan(r_weights("tq4_1s", m, k), t).kernels
    assert kernels[0] == "rotate_tq4_1s_f16" and kernels[-1] == "mul_mat_fixup_tq4_1s" and any(
        n.startswith("mmq_tq4_1s_wgmma_ra_n") for n in kernels), kernels
    _codec_prefill("tq4_1s", m, k, t, "rotate_tq4_1s_f16")


@pytest.mark.parametrize("arch", [None, "sm_89"])
@pytest.mark.parametrize("t", [40, 512])
def test_tq4_1s_rotation_writes_the_gemms_fp16_copy(t, arch):
    """rotate_tq4_1s_f16 (TQ4_1S's prefill: x of either dtype rotated into fp32 for the fixup and into the fp16 copy
    the GEMM reads, one launch) gives the bits of the launches it replaced (PTXGEN_ROTATE_F16=0: convert_f32 for an
    fp16 x, rotate_tq4_1s, convert_f16_perm / convert_f16) on the register-A and prepared routes (sm_90) and the
    fp16 mma.sync GEMM (sm_89's PTX), fp32 and fp16 x, a token past fp16 after the rotation among them."""
    import torch

    import ptxgen.runtime as r

    if arch is None and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the register-A and prepared GEMMs are sm_90a's")
    rng = np.random.default_rng(t)
    m, k = 1000, 3584
    raw = formats.quantize("tq4_1s", rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw("tq4_1s", raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    x[t // 3, 100] = 6e4  # fits fp16; rotated, its block spreads it: ~1e4 a value
    e = np.zeros((1, 32), np.float32)
    e[0, 5] = 7e4  # a block whose rotation is 7e4 at one place (x ±12374, fp16 either way): the fixup's token
    x[t // 2, 64:96] = formats.rht_inverse(e)[0]
    routes = [{}, {"codec_ra_mmq_min_tokens": 1 << 30}] if arch is None else [{"mmq_x16_min_work": 0}]
    for rules in routes:
        with tuning.override(**rules):
            for xt in (torch.from_numpy(x).cuda(), torch.from_numpy(x).cuda().half()):
                assert r.mul_mat_plan(w, t, arch=arch, x_dtype=str(xt.dtype).split(".")[1]).kernels[0] == \
                    "rotate_tq4_1s_f16", rules
                new = r.mul_mat(w, xt, arch=arch).cpu().numpy()
                with knobs.override(PTXGEN_ROTATE_F16="0"):
                    old = r.mul_mat(w, xt, arch=arch).cpu().numpy()
                np.testing.assert_array_equal(new.view(np.uint32), old.view(np.uint32))


def r_weights(fmt, m, k):
    """Zero weights of `fmt` (M, K) on the device: for plan queries."""
    import ptxgen.runtime as r

    return r.QuantTensor.from_raw(fmt, np.zeros(formats.get(fmt).row_bytes(k) * m, np.uint8), (m, k))


@pytest.mark.parametrize("fmt", ["q5_K", "q8_0"])
@pytest.mark.parametrize("m,k,t,bn", [(300, 1024, 200, 128), (4096, 4096, 1024, 256), (129, 512, 700, 256),
                                      (4096, 14336, 16, 64)])
def test_codec_register_a_gemm_converting_x_itself(fmt, m, k, t, bn):
    """mmq_<fmt>_wgmma_ra_n*_cx (mmq.WGMMA_CX_CODECS; path "wgmma_ra_cx"): the codec's register-A GEMM with the
    producer warpgroup's idle warps converting fp32 x, no convert_f16_perm: bit for bit the build after
    convert_f16_perm ("wgmma_ra_x16") on the same inputs (NaN-poisoned y), within 1e-3 of float64, the queue and
    x-ready counts back at zero, an activation past fp16 flagged; mul_mat takes it at 4096² x 1024 (one K split). The
    n64 build (T = 16 on 4096x14336: four K splits whose converters share x) is not dispatched yet."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    if r.current().sm != 90:
        pytest.skip("the register-A GEMMs are sm_90a's")
    rng = np.random.default_rng(m + t + k)
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    got, flag = run_mmq(r, raw, m, k, x, bn, "wgmma_ra_cx", fmt)
    assert flag == 0 and np.isfinite(got).all()
    assert rel_ref(got, fmt, raw, m, k, x) <= 1e-3
    after, _ = run_mmq(r, raw, m, k, x, bn, "wgmma_ra_x16", fmt)
    np.testing.assert_array_equal(got.view(np.uint32), after.view(np.uint32))
    x[t - 1, k - 1] = -1e6  # overflows fp16
    assert run_mmq(r, raw, m, k, x, bn, "wgmma_ra_cx", fmt)[1] == 1
    if t >= 1024:
        assert ops.mul_mat_plan(r_weights(fmt, m, k), t).kernels[0] == f"mmq_{fmt.lower()}_wgmma_ra_n256_cx"


@pytest.mark.parametrize("fmt", ["q4_K", "q6_K", "q8_0"])
def test_weights_past_fp16_are_computed_in_fp32(fmt):
    """Blocks whose scale fields let a weight leave fp16's range (one scale at twice formats.fp16_weight_scale):
    mul_mat at a prefill T runs the fp32 kernels (the GEMMs hold weights in fp16, where those weights are inf) and
    matches float64 within 1e-5; mul_mat_id likewise, without its grouped GEMM."""
    import ptxgen.runtime as r

    rng = np.random.default_rng(7)
    m, k, t = 300, 2048, 64
    f = formats.get(fmt)
    blocks = f.fields(formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32)), (m, k))
    blocks["d"][3] = np.float16(2 * formats.fp16_weight_scale(fmt))
    raw = blocks.view(np.uint8).reshape(-1).copy()
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    assert not w.fp16_weights
    x = rng.standard_normal((t, k)).astype(np.float32)
    got = r.mul_mat(w, x)
    assert not any(n.startswith("mmq_") for n in r.mul_mat_plan(w, t).kernels)
    assert np.isfinite(got).all() and rel_ref(got, fmt, raw, m, k, x) <= 1e-5
    e, tm = 4, 1024  # the same rows as 4 experts of 75; 2048 pairs: past the pair GEMV's rule (the grouped route's)
    we = r.QuantTensor.from_raw(fmt, raw, (e, m // e, k))
    ids = rng.integers(0, e, (tm, 2)).astype(np.int32)
    assert any(n.startswith("mmq_") for n in r.ops.mul_mat_id_kernels(fmt, tm, 2, e, k, m // e))
    xm = rng.standard_normal((tm, k)).astype(np.float32)
    y = r.mul_mat_id(we, xm, ids)
    assert np.isfinite(y).all() and rel(y, formats.mul_mat_id_ref(fmt, raw, we.shape, xm, ids)) <= 1e-5


@pytest.mark.parametrize("fmt,t", [("q4_K", 40), ("q4_K", 200), ("q4_K", 1100), ("q6_K", 600), ("q8_0", 1100),
                                   ("tq4_1s", 100)])
def test_a_token_too_small_for_fp16_is_recomputed_exactly(fmt, t):
    """A token whose activations all lie under fp16's precision (scaled by 1e-6: fp16 would keep them to ~2% at best)
    and one of zeros beside it, through the fp16 GEMM routes mul_mat plans at these T (convert_f16, the converting
    GEMMs, TQ4_1S's rotation): the conversion raises the flag (kernels/convert_f16.py too_small), the fixup
    recomputes that token in fp32 — within 1e-5 of float64 — and the others keep the GEMM's bound."""
    import ptxgen.runtime as r

    rng = np.random.default_rng(t)
    m, k = 384, 2048
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    x[3] *= np.float32(1e-6)
    x[7] = 0
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    got = r.mul_mat(w, x)
    want = formats.gemm_ref(fmt, raw, m, k, x)
    assert rel(got[3], want[3]) <= 1e-5, r.mul_mat_plan(w, t).kernels
    assert (got[7] == 0).all()
    assert rel(np.delete(got, 3, axis=0), np.delete(want, 3, axis=0)) <= 1e-3
    from ptxgen.runtime import ops

    assert not ops.workspace_state().any(), "mul_mat left the flag (or a counter) raised for the next call"
