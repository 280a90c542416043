"""L3: mul_mat_id (MoE) on the GPU against the float64 reference (formats.mul_mat_id_ref): every format with an MoE
GEMV (TQ4_1S on its rotated x), x shared by a token's slots or one row per slot, skewed routes; device ids out of
range give NaN rows without a synchronization; host ids out of range are refused; on the caller's torch stream and
inside a CUDA graph, the same bits as eager; GPU == emulator for the MoE kernels is test_gpu_emu_crosscheck's."""
import numpy as np
import pytest

from ptxgen import formats
from ptxgen.testing.strategies import random_raw
from conftest import rel

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _grouped_routes_at_few_tokens():
    """Most of this file's shapes are small, so the pair GEMV (RULES.moe_pair_max_weights) would take most calls of a few
    tokens: off here, so the grouped routes run; the pair route's own tests turn it back on."""
    from ptxgen import tuning

    with tuning.override(moe_pair_max_weights=0):
        yield


def _torch():
    return pytest.importorskip("torch")


def _case(fmt, e, m, k, t, slots, seed, skew=False, per_slot=False):
    import ptxgen.runtime as r

    rng = np.random.default_rng(seed)
    raw = random_raw(fmt, e * m, k, rng)  # valid blocks without the quantizer (seconds, not minutes, at 117 M weights)
    w = r.QuantTensor.from_raw(fmt, raw, (e, m, k))
    ids = (np.full((t, slots), e - 1) if skew else rng.integers(0, e, (t, slots))).astype(np.int32)
    x = rng.standard_normal((t, slots, k) if per_slot else (t, k)).astype(np.float32)
    return w, raw, x, ids


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"])
@pytest.mark.parametrize("e,m,k,t,slots,skew,per_slot", [(8, 768, 2048, 1, 8, False, False),  # a pair per row
                                                         (32, 1792, 2048, 3, 4, False, True),  # grouped
                                                         (4, 300, 512, 5, 2, True, False),  # grouped, 10 on one
                                                         (6, 64, 4096, 16, 1, False, True),
                                                         (16, 256, 1024, 600, 2, False, False),  # 2 id windows
                                                         (32, 300, 1024, 448, 2, False, False)])  # Q4_K: n48_m256
def test_mul_mat_id_matches_the_reference(fmt, e, m, k, t, slots, skew, per_slot):
    """Within 1e-5 of float64 (fp32 products of ggml's weights) through the MoE GEMVs, 1e-3 through the grouped
    tensor-core GEMMs (fp16 activations; ops.mul_mat_id_kernels says which runs), NumPy in and out, the output
    poisoned first. TQ4_1S: x rotated once first (rotate_tq4_1s, the route's first kernel), the reference on x and
    the weights' own W as formats.dequantize gives it."""
    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    route = ops.mul_mat_id_kernels(fmt, t, slots, e, k, m)
    assert route[-1].endswith("_idg" if t >= 2 else "_id") and (route[0] == "rotate_tq4_1s") == (fmt == "tq4_1s")
    w, raw, x, ids = _case(fmt, e, m, k, t, slots, seed=e + m + t, skew=skew, per_slot=per_slot)
    out = r.DeviceArray.empty((t, slots, m), np.float32)
    out.owner.fill_bytes(0xFF)
    r.mul_mat_id(w, x, ids, out=out)
    got = out.numpy()
    want = formats.mul_mat_id_ref(w.fmt, raw, w.shape, x, ids)
    grouped = any(n.startswith("mmq_") for n in route)  # (TQ4_1S's rotation is a launch of its exact routes too)
    assert np.isfinite(got).all() and rel(got, want) <= (1e-3 if grouped else 1e-5)
    np.testing.assert_array_equal(r.mul_mat_id(w, x, ids), got)


@pytest.mark.parametrize("fmt,t,per_slot", [("q4_K", 1, False), ("q4_K", 300, True), ("tq4_1s", 40, False),
                                            ("q6_K", 40, False), ("q8_0", 6, True), ("q4_K", 32, False)])
def test_an_fp16_x_gives_the_bits_of_its_fp32_widening(fmt, t, per_slot):
    """mul_mat_id on a float16 x (the kernels' _x16 twins where they read x: the pair / grouped GEMVs, moe_gather(_sums);
    sm_89's grouped route widened once by convert_f32; TQ4_1S rotated from it as it is, rotate_tq4_1s_f16) gives the
    bits of the call on the same values as float32 — with an inf in one token too (the grouped routes' gated exact
    GEMV then runs on it: its twin)."""
    import ptxgen.runtime as r

    w, _, x, ids = _case(fmt, 8, 300, 512, t, 2, seed=t, skew=False, per_slot=per_slot)
    x16 = x.astype(np.float16)
    np.testing.assert_array_equal(r.mul_mat_id(w, x16, ids), r.mul_mat_id(w, x16.astype(np.float32), ids))
    np.testing.assert_array_equal(r.mul_mat_id(w, x16, ids, arch="sm_89"),
                                  r.mul_mat_id(w, x16.astype(np.float32), ids, arch="sm_89"))
    import torch  # torch tensors: the first call plans, the second takes the hot path (_mul_mat_id_torch), fp16 too

    xt, it = torch.from_numpy(x16).cuda(), torch.from_numpy(ids).cuda()
    want = r.mul_mat_id(w, x16.astype(np.float32), ids)
    for _ in range(2):
        got = r.mul_mat_id(w, xt, it)
        assert got.dtype == torch.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got.cpu().numpy(), want)
    x16[t // 2, ..., 7] = np.inf
    np.testing.assert_array_equal(r.mul_mat_id(w, x16, ids).view(np.uint32),
                                  r.mul_mat_id(w, x16.astype(np.float32), ids).view(np.uint32))


@pytest.mark.parametrize("e,m,k,t,slots,skew,per_slot", [(32, 1792, 2048, 5, 4, False, True),
                                                         (4, 300, 512, 10, 2, True, False),
                                                         (128, 768, 2048, 32, 8, False, False)])
def test_the_integer_weight_grouped_gemm_matches_the_reference(e, m, k, t, slots, skew, per_slot):
    """Q4_K's integer-weight grouped route (rule moe_int_weights_max_pairs; the rule pinned on here):
    moe_gather_sums and mmq_q4_k_wgmma_iw_n16_moe within 1e-3 of float64, graph and eager alike."""
    import ptxgen.runtime as r
    from ptxgen import tuning
    from ptxgen.runtime import ops

    with tuning.override(moe_int_weights_max_pairs=64):
        assert "mmq_q4_k_wgmma_iw_n16_moe" in ops.mul_mat_id_kernels("q4_K", t, slots, e, k, m)
        w, raw, x, ids = _case("q4_K", e, m, k, t, slots, seed=e + t, skew=skew, per_slot=per_slot)
        got = r.mul_mat_id(w, x, ids)
    want = formats.mul_mat_id_ref(w.fmt, raw, w.shape, x, ids)
    assert np.isfinite(got).all() and rel(got, want) <= 1e-3


@pytest.mark.parametrize("e,m,k,t,slots,per_slot", [(8, 2048, 768, 40, 4, True), (4, 1024, 1280, 300, 2, False),
                                                   (32, 2048, 768, 128, 8, True)])
def test_q6_k_experts_on_short_rows_by_row_groups_match_the_reference(e, m, k, t, slots, per_slot):
    """Q6_K experts whose rows are not 16-byte multiples (K = 768: Qwen3-30B-A3B's ffn_down_exps; 1280) on the grouped
    register-A build reading 8-row groups (mmq_q6_k_wgmma_ra_n*_g8_moe, rule moe_row_groups pinned on here): within
    1e-3 of float64, run to run the same bits."""
    import ptxgen.runtime as r
    from ptxgen import tuning
    from ptxgen.runtime import ops

    with tuning.override(moe_row_groups=True):
        assert any(n.endswith("_g8_moe") for n in ops.mul_mat_id_kernels("q6_K", t, slots, e, k, m))
        w, raw, x, ids = _case("q6_K", e, m, k, t, slots, seed=e + t, per_slot=per_slot)
        got = r.mul_mat_id(w, x, ids)
        np.testing.assert_array_equal(r.mul_mat_id(w, x, ids), got)
    want = formats.mul_mat_id_ref(w.fmt, raw, w.shape, x, ids)
    assert np.isfinite(got).all() and rel(got, want) <= 1e-3


@pytest.mark.parametrize("tile", ["n64_m256", "n80_m256"])
def test_the_wide_trial_tiles_match_the_reference(tile):
    """Q4_K's 256-row tiles past n48 (kernels/mmq.py GROUPED_WIDE_TILES: n80_m256 shipped from 60 pairs an expert,
    n64_m256 a trial build; consumers at 112 registers — at 120 their setmaxnreg.inc hung on an H100), here reached
    at any T by naming them alone in rule moe_wgmma_tile_pairs:
    within 1e-3 of float64 with one expert past a tile of pairs and M past a 256-row tile."""
    import ptxgen.runtime as r
    from ptxgen import tuning
    from ptxgen.runtime import ops

    e, m, k, t, slots = 3, 300, 768, 70, 2
    with tuning.override(moe_int_weights_max_pairs=0, moe_wgmma_tile_pairs={tile: 1}):
        assert f"mmq_q4_k_wgmma_ra_{tile}_moe" in ops.mul_mat_id_kernels("q4_K", t, slots, e, k, m)
        w, raw, x, ids = _case("q4_K", e, m, k, t, slots, seed=int(tile[1:3]))
        ids[:55, 0] = 1  # expert 1: past one tile of pairs
        got = r.mul_mat_id(w, x, ids)
    want = formats.mul_mat_id_ref(w.fmt, raw, w.shape, x, ids)
    assert np.isfinite(got).all() and rel(got, want) <= 1e-3


@pytest.mark.parametrize("t,per_slot", [(1, False), (5, True), (64, False)])
def test_the_torch_hot_path_gives_the_general_paths_bits_and_its_errors(t, per_slot):
    """Once a shape's plan is cached, a call on CUDA torch tensors reads their attributes and launches
    (ops._mul_mat_id_torch): the bits of the same call with NumPy operands, with out given or made by torch; any
    input it does not take (ids int64, out of the wrong shape, a non-contiguous x) still gets the general path's
    error."""
    torch = _torch()
    import ptxgen.runtime as r

    w, _, x, ids = _case("q4_K", 8, 256, 512, t, 2, seed=t, per_slot=per_slot)
    want = r.mul_mat_id(w, x, ids)  # NumPy in and out: the general path
    xt, it = torch.from_numpy(x).cuda(), torch.from_numpy(ids).cuda()
    out = torch.full((t, 2, 256), float("nan"), device="cuda")
    for _ in range(2):  # the first call caches the plan, the second takes the hot path
        assert r.mul_mat_id(w, xt, it, out=out) is out
        np.testing.assert_array_equal(out.cpu().numpy(), want)
        np.testing.assert_array_equal(r.mul_mat_id(w, xt, it).cpu().numpy(), want)
    with pytest.raises(TypeError, match="int32"):
        r.mul_mat_id(w, xt, it.long())
    with pytest.raises(ValueError, match="shape"):
        r.mul_mat_id(w, xt, it, out=torch.empty((t, 2, 255), device="cuda"))
    wide = torch.zeros(xt.shape[:-1] + (2 * xt.shape[-1],), device="cuda")
    with pytest.raises(ValueError, match="contiguous"):
        r.mul_mat_id(w, wide[..., ::2], it)


def test_device_ids_out_of_range_give_nan_rows_and_host_ids_are_refused():
    torch = _torch()
    import ptxgen.runtime as r

    for t in (1, 3, 600):  # the pair build, the grouped one (expert 0's CTAs take the strays), over 2 id windows
        w, raw, x, ids = _case("q4_K", 4, 256, 1024, t, 2, seed=5)
        ids[t // 2, 0], ids[t - 1, 1] = -1, 4
        out = torch.full((t, 2, 256), 7.0, device="cuda")  # finite: a NaN must be written
        got = r.mul_mat_id(w, torch.from_numpy(x).cuda(), torch.from_numpy(ids).cuda(), out=out).cpu().numpy()
        bad = np.zeros(ids.shape, bool)
        bad[t // 2, 0] = bad[t - 1, 1] = True
        assert np.isnan(got[bad]).all() and np.isfinite(got[~bad]).all()
        want = formats.mul_mat_id_ref("q4_K", raw, w.shape, x, ids)
        assert t == 1 or rel(got[~bad], want[~bad]) <= (1e-3 if t == 600 else 1e-5)  # T = 1: both slots bad;
        # 600: the grouped GEMM (fp16 activations), moe_group writing the NaN rows
    with pytest.raises(ValueError, match=r"ids\[300, 0\] = -1 is not an expert of w \(0 ≤ id < 4\); 2 out of range"):
        r.mul_mat_id(w, x, ids)  # host ids: refused before anything runs


def test_errors_counts_device_ids_out_of_range_eagerly_and_in_a_graph():
    """mul_mat_id(errors=): the count of out-of-range device ids added to errors[0] on the call's stream — eager,
    then each replay of a captured call adding its count again — with the same NaN rows and the same other bits
    as without it; ids all in range add nothing."""
    torch = _torch()
    import ptxgen.runtime as r

    for t in (3, 600):
        w, raw, x, ids = _case("q4_K", 4, 256, 1024, t, 2, seed=6)
        ids[t // 2, 0], ids[t - 1, 1], ids[0, 1] = -1, 4, 1 << 30
        xd, idd = torch.from_numpy(x).cuda(), torch.from_numpy(ids).cuda()
        errors = torch.zeros(2, dtype=torch.int32, device="cuda")
        got = r.mul_mat_id(w, xd, idd, errors=errors)
        assert errors.tolist() == [3, 0]
        torch.testing.assert_close(got, r.mul_mat_id(w, xd, idd), rtol=0, atol=0, equal_nan=True)
        good = torch.from_numpy(np.abs(ids) % 4).int().cuda()
        r.mul_mat_id(w, xd, good, errors=errors)
        assert errors.tolist() == [3, 0]
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            r.mul_mat_id(w, xd, idd, errors=errors)  # warm-up on the capturing stream
            with torch.cuda.graph(g, stream=s):
                r.mul_mat_id(w, xd, idd, errors=errors)
        torch.cuda.synchronize()
        assert errors.tolist() == [6, 0]
        for _ in range(2):
            g.replay()
        torch.cuda.synchronize()
        assert errors.tolist() == [12, 0]


@pytest.mark.parametrize("fmt,t", [("q6_K", 3), ("q4_K", 64), ("q6_K", 64)])  # the grouped GEMV; the grouped GEMM
def test_on_a_busy_side_stream_and_in_a_cuda_graph_the_eager_bits(fmt, t):
    """x and ids made on a side stream behind 2 ms of work, the op on that stream (torch's current), then the same
    calls captured in a torch CUDA graph and replayed: bit-identical to a quiet eager call (the grouped GEMM's
    scratch and queue in the stream's and the capture's workspaces)."""
    torch = _torch()
    import ptxgen.runtime as r

    w, raw, x, ids = _case(fmt, 16, 1024, 2048, t, 4, seed=9)
    w.to_device()
    xt, it = torch.from_numpy(x).cuda(), torch.from_numpy(ids).cuda()
    want = r.mul_mat_id(w, xt, it)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(int(2e6))
        xs, ids_s = xt * 1.0, it + 0
        y = r.mul_mat_id(w, xs, ids_s)
    side.synchronize()
    assert torch.equal(y, want)
    out = torch.empty_like(want)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        r.mul_mat_id(w, xt, it, out=out)
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.parametrize("fmt,t", [("q8_0", 4), ("q4_K", 40)])
def test_two_threads_on_two_streams_share_the_prepared_launch(fmt, t):
    """mul_mat_id keeps one plan per weight and shape, patched per call: two threads on their own torch streams, 50
    calls each on the same weights with their own x and ids, each get their own eager answer (the grouped GEMM:
    each stream its own workspace, so its scratch and queue are not shared)."""
    import threading

    torch = _torch()
    import ptxgen.runtime as r

    w, raw, x, ids = _case(fmt, 8, 512, 1024, t, 2, seed=3)
    w.to_device()
    inputs = [(torch.from_numpy(x).cuda() * (i + 1), torch.from_numpy((ids + i) % 8).cuda()) for i in range(2)]
    want = [r.mul_mat_id(w, xi, ii) for xi, ii in inputs]
    torch.cuda.synchronize()
    bad = []

    def run(i):
        st = torch.cuda.Stream()
        with torch.cuda.stream(st):
            for _ in range(50):
                y = r.mul_mat_id(w, *inputs[i])
                if not torch.equal(y, want[i]):
                    bad.append(i)
        st.synchronize()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not bad


def test_torch_operator_under_torch_compile():
    """torch.ops.ptxgen.mul_mat_id (ptxgen.torch): its fake implementation traces, and a function calling it runs
    under torch.compile(fullgraph=True) with the eager bits."""
    torch = _torch()
    import ptxgen.runtime as r
    import ptxgen.torch  # noqa: F401 - registers the operators

    w, raw, x, ids = _case("q4_K", 8, 256, 512, 3, 2, seed=7)
    wb = torch.from_numpy(raw.reshape(-1).view(np.uint8)).cuda()
    xt, it = torch.from_numpy(x).cuda(), torch.from_numpy(ids).cuda()
    want = r.mul_mat_id(w, xt, it)

    def f(wb, xt, it):
        return torch.ops.ptxgen.mul_mat_id(wb, xt * 1.0, it, "q4_K", 8, 256, 512)
    got = torch.compile(f, fullgraph=True)(wb, xt, it)
    assert got.shape == (3, 2, 256) and torch.equal(got, want)


def test_a_captured_mul_mat_id_on_a_reserved_workspace():
    """Workspace.reserve(w, T, slots=k) then the grouped route captured with workspace=: the replay gives the eager
    bits, and nothing was allocated inside the capture."""
    torch = _torch()
    import ptxgen.runtime as r

    w, raw, x, ids = _case("q4_K", 8, 512, 1024, 48, 2, seed=11)
    w.to_device()
    ws = r.Workspace().reserve(w, 48, slots=2)
    xt, it = torch.from_numpy(x).cuda(), torch.from_numpy(ids).cuda()
    want = r.mul_mat_id(w, xt, it, workspace=ws)
    out = torch.empty_like(want)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        r.mul_mat_id(w, xt, it, out=out, workspace=ws)
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"])
def test_a_few_tokens_run_the_pair_gemv_exactly(fmt):
    """From 2 tokens, up to RULES.moe_pair_max_weights weights read, the one-token GEMV over every pair (TQ4_1S's
    after its rotation of x): within 1e-5 of float64, the output poisoned first, the same bits run to run."""
    import ptxgen.runtime as r
    from ptxgen import tuning
    from ptxgen.runtime import ops

    with tuning.override(moe_pair_max_weights=1 << 26):
        e, m, k, t, slots = 32, 1792, 2048, 3, 4
        rotation = ["rotate_tq4_1s"] if fmt == "tq4_1s" else []
        assert ops.mul_mat_id_kernels(fmt, t, slots, e, k, m) == rotation + [f"gemv_{fmt.lower()}_f32_id"]
        w, raw, x, ids = _case(fmt, e, m, k, t, slots, seed=9, per_slot=fmt == "q8_0")
        out = r.DeviceArray.empty((t, slots, m), np.float32)
        out.owner.fill_bytes(0xFF)
        r.mul_mat_id(w, x, ids, out=out)
        got = out.numpy()
        assert np.isfinite(got).all() and rel(got, formats.mul_mat_id_ref(fmt, raw, w.shape, x, ids)) <= 1e-5
        np.testing.assert_array_equal(r.mul_mat_id(w, x, ids), got)


@pytest.mark.parametrize("fmt", ["q4_K", "q6_K"])
def test_a_token_too_small_for_fp16_is_recomputed_exactly(fmt):
    """mul_mat_id through the grouped GEMM (fp16 activations) with a token scaled by 1e-6: moe_gather raises the gate
    (kernels/convert_f16.py too_small) and the gated exact GEMV recomputes the call, so that token is within 1e-5 of
    float64 too, not fp16's ~2% on it."""
    import ptxgen.runtime as r

    w, raw, x, ids = _case(fmt, 8, 256, 1024, 64, 2, seed=11)
    x[5] *= np.float32(1e-6)
    got = r.mul_mat_id(w, x, ids)
    want = formats.mul_mat_id_ref(w.fmt, raw, w.shape, x, ids)
    assert rel(got[5], want[5]) <= 1e-5
    assert rel(got, want) <= 1e-3
