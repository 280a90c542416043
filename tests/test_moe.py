"""mul_mat_id (MoE) without a GPU: expert tensors (E, M, K) in QuantTensor and GGUF, the op's argument checks
before any device work, and its decode GEMV gemv_<fmt>_f32_id in the emulator against formats.mul_mat_id_ref over
skewed, empty, duplicate and out-of-range expert loads."""
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ptxgen import formats
from conftest import rel
from ptxgen.arch import get_arch
from ptxgen.emu.harness import check_kernel, gemv_id_case
from ptxgen.kernels import get_kernel
from ptxgen.runtime import QuantTensor, mul_mat, mul_mat_id
from ptxgen.runtime.tensors import list_gguf_tensors, read_gguf_tensor, write_gguf


@pytest.fixture(autouse=True)
def _grouped_routes_at_few_tokens():
    """This file's shapes are small, so the pair GEMV (RULES.moe_pair_max_weights) would take most calls of a few
    tokens: off here, so the grouped routes run; the pair route's own tests turn it back on."""
    from ptxgen import tuning

    with tuning.override(moe_pair_max_weights=0):
        yield


def _experts(fmt="q4_K", e=3, m=4, k=256, seed=0):
    return np.random.default_rng(seed).standard_normal((e, m, k)).astype(np.float32)


def test_an_expert_tensor_keeps_its_three_dimensions():
    w = _experts()
    q = QuantTensor.from_numpy(w, "q4_K")
    assert q.shape == (3, 4, 256) and q.experts == 3 and q.rows == 12
    assert q.nbytes == 12 * formats.get("q4_K").row_bytes(256)
    assert q.raw().tobytes() == formats.quantize("q4_K", w.reshape(12, 256)).tobytes()
    assert QuantTensor.from_raw("q4_K", q.raw(), (3, 4, 256)).shape == (3, 4, 256)
    assert QuantTensor.from_numpy(w[0], "q4_K").experts == 1
    with pytest.raises(ValueError, match=r"\(M, K\), or \(E, M, K\)"):
        QuantTensor("q4_K", (2, 3, 4, 256), host=np.zeros(0, np.uint8))
    with pytest.raises(ValueError, match="no rows"):
        QuantTensor.from_raw("q4_K", np.zeros(0, np.uint8), (0, 4, 256))


def test_one_expert_of_an_expert_tensor():
    """QuantTensor.expert(e): the (M, K) tensor of expert e, its bytes those of rows e·M .. (e + 1)·M; on the GPU a
    view at the expert's offset that keeps the whole tensor alive; bad indices and 2-D tensors refused."""
    from ptxgen.runtime.driver import DeviceBuffer
    from ptxgen.testing import fakegpu

    q = QuantTensor.from_numpy(_experts(), "q4_K")
    rows = q.raw().reshape(12, -1)
    one = q.expert(2)
    assert one.shape == (4, 256) and one.raw().tobytes() == rows[8:12].tobytes()
    with pytest.raises(IndexError, match="3 is not one of the 3 experts"):
        q.expert(3)
    with pytest.raises(ValueError, match="holds no experts"):
        one.expert(0)
    dev = QuantTensor("q4_K", (3, 4, 256), device=DeviceBuffer.wrap(fakegpu.BASE, q.nbytes))
    view = dev.expert(1)
    assert view.ptr == fakegpu.BASE + 4 * 144 and view.buffer.nbytes == 4 * 144 and view._owner is dev


def test_expert_tensors_round_trip_through_gguf(tmp_path):
    q = QuantTensor.from_numpy(_experts("q6_K"), "q6_K")
    path = tmp_path / "moe.gguf"
    write_gguf(path, {"blk.0.ffn_gate_exps.weight": q})
    info = list_gguf_tensors(path)[0]
    assert info.dims == (256, 4, 3) and info.shape == (3, 4, 256)  # GGUF: innermost first
    fmt, shape, raw = read_gguf_tensor(path, "blk.0.ffn_gate_exps.weight")
    assert (fmt, shape) == ("q6_K", (3, 4, 256)) and raw.tobytes() == q.raw().tobytes()
    back = QuantTensor.from_gguf(path, "blk.0.ffn_gate_exps.weight")
    assert back.shape == (3, 4, 256) and back.raw().tobytes() == q.raw().tobytes()


def test_mul_mat_id_checks_its_arguments_before_any_device_work():
    w = QuantTensor.from_numpy(_experts(), "q4_K")
    x = np.ones((2, 256), np.float32)
    ids = np.array([[0, 2], [1, 1]], np.int32)
    with pytest.raises(ValueError, match="route tokens to them with mul_mat_id"):
        mul_mat(w, x)
    with pytest.raises(ValueError, match=r"w must hold experts, shape \(E, M, K\)"):
        mul_mat_id(QuantTensor.from_numpy(_experts()[0], "q4_K"), x, ids)
    with pytest.raises(ValueError, match="mode must be 'exact'"):
        mul_mat_id(w, x, ids, mode="fast")
    with pytest.raises(ValueError, match="q8_1 is an activation format"):  # refused as weights at all
        mul_mat_id(QuantTensor.from_numpy(_experts(), "q8_1"), x, ids)
    with pytest.raises(ValueError, match=r"ids must have shape \(T, slots\)"):
        mul_mat_id(w, x, ids[0])
    with pytest.raises(ValueError, match=r"x must have shape \(2, 256\) or \(2, 2, 256\)"):
        mul_mat_id(w, np.ones((3, 256), np.float32), ids)
    with pytest.raises(TypeError, match="expected dtype int32, got int64"):
        mul_mat_id(w, x, ids.astype(np.int64))
    with pytest.raises(ValueError, match=r"ids\[1, 0\] = 3 is not an expert of w \(0 ≤ id < 3\); 2 out of range"):
        mul_mat_id(w, x, np.array([[0, 2], [3, -1]], np.int32))
    with pytest.raises(TypeError, match="errors must be a device array"):
        mul_mat_id(w, x, ids, errors=np.zeros(1, np.int32))


@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
def test_moe_check_ids_counts_the_ids_outside_the_experts(arch):
    """mul_mat_id(errors=)'s kernel: errors[0] += the ids < 0 or ≥ E (on top of what it held: a count across a
    caller's steps), nothing else written; ids all in range add nothing; more ids than one CTA's."""
    ptx = get_kernel("moe_check_ids").for_arch(get_arch(arch)).ptx()
    for seed in range(3):
        out = check_kernel("moe_check_ids", ptx, seed=seed)
        assert out.ok, out.detail
    out = check_kernel("moe_check_ids", ptx, seed=4, ids=np.arange(600, dtype=np.int32).reshape(300, 2) % 7)
    assert out.ok and out.got[0] == 5, out.detail


def _case(fmt, arch, kind="id", **kw):
    name = f"gemv_{fmt.lower()}_f32_{kind}"
    k = get_kernel(name).for_arch(get_arch(arch))
    return gemv_id_case(k.ptx(), dict(k.meta, name=name), np.random.default_rng(kw.pop("seed", 0)), **kw)


LOADS = {"one expert takes every token": [[2, 2], [2, 2], [2, 2]],
         "every slot its own expert": [[0, 1], [2, 3]],
         "an id out of range": [[1, -1], [4, 0]],
         "more than 8 pairs on one expert": [[3, 1]] * 9 + [[1, 3]] * 2,
         "64 pairs, all on one expert": [[2] * 8] * 8}


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"])
@pytest.mark.parametrize("load,kind", [(load, kind) for load in LOADS for kind in ("id", "idg")
                                       if kind == "idg" or not load.startswith("64")])  # 64: the grouped build's
def test_moe_gemv_in_the_emulator(fmt, load, kind):
    """Both MoE GEMVs (a pair per grid row; per expert its pairs 8 at a time): skewed loads (all pairs on one
    expert, the others none; 9 and 64 pairs on one expert: 2 and 8 passes), distinct experts, out-of-range ids (−1
    and E: the pair's row NaN, the others right); x shared by a token's slots, and one row per slot."""
    for per_slot in (False, True):
        out = _case(fmt, "sm_90a", kind, shape=(4, 21, 544 if fmt == "q8_0" else 512),
                    ids=np.array(LOADS[load], np.int32), x_per_slot=per_slot, seed=len(load))
        assert out.ok, out.detail


@pytest.mark.parametrize("fmt,per_slots", [("q8_0", (True,)),
                                           pytest.param("q4_K", (False, True), marks=pytest.mark.slow)])
def test_grouped_moe_gemv_across_id_windows(fmt, per_slots):
    """1400 pairs: two windows of the grouped build's scan (1024 pairs each), an expert with matches in both, one
    with none, and out-of-range ids in each window; x one row per slot (and, in the slow tier, shared)."""
    rng = np.random.default_rng(5)
    ids = rng.choice([0, 1, 1, 1, 3], size=(700, 2)).astype(np.int32)  # expert 2 gets none
    ids[3, 1], ids[600, 0] = -1, 4
    for per_slot in per_slots:
        out = _case(fmt, "sm_90a", "idg", shape=(4, 17, 256), ids=ids, x_per_slot=per_slot, seed=9)
        assert out.ok, out.detail


# how drawn routes load the experts: uniformly, every pair on one expert, on a few (the others empty), or skewed
# (expert j drawn with weight 1 / (j + 1)^2: most pairs on the first, a long tail of near-empty ones)
EXPERT_LOADS = ("uniform", "one", "few", "skewed")


def _drawn_ids(rng, e: int, t: int, slots: int, load: str) -> np.ndarray:
    """(T, slots) int32 expert ids under `load` (EXPERT_LOADS); a token's slots may repeat an expert."""
    if load == "one":
        return np.full((t, slots), int(rng.integers(e)), np.int32)
    if load == "few":
        pool = rng.choice(e, size=min(e, 2), replace=False)
        return pool[rng.integers(len(pool), size=(t, slots))].astype(np.int32)
    p = 1.0 / np.arange(1, e + 1) ** 2 if load == "skewed" else np.ones(e)
    return rng.choice(e, size=(t, slots), p=p / p.sum()).astype(np.int32)


@settings(max_examples=8, deadline=None)
@given(fmt=st.sampled_from(["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"]), e=st.integers(1, 5), m=st.integers(1, 40),
       kb=st.integers(1, 3), t=st.integers(1, 6), slots=st.integers(1, 3), seed=st.integers(0, 2**31 - 1),
       arch=st.sampled_from(["sm_89", "sm_90a", "sm_120a"]), kind=st.sampled_from(["id", "idg"]),
       load=st.sampled_from(EXPERT_LOADS))
def test_moe_gemv_drawn_shapes_and_routes(fmt, e, m, kb, t, slots, seed, arch, kind, load):
    """Both MoE GEMVs on drawn formats, shapes, targets and routes (uniform, all on one expert, a few experts with
    the rest empty, skewed), x shared or per slot."""
    rng = np.random.default_rng(seed)
    ids = _drawn_ids(rng, e, t, slots, load)
    out = _case(fmt, arch, kind, shape=(e, m, 256 * kb), ids=ids, x_per_slot=bool(seed & 1), seed=seed)
    assert out.ok, out.detail


class _Launches:
    """mul_mat_id on a fake H200 (ptxgen.testing.fakegpu): every prepared launch's run recorded, with its cells."""

    def __init__(self, monkeypatch):
        from ptxgen.runtime.driver import PreparedLaunch
        from ptxgen.testing import fakegpu

        fakegpu.install(monkeypatch)
        self.runs = []
        monkeypatch.setattr(PreparedLaunch, "run", lambda launch, s: self.runs.append(
            (launch.fn.name, launch.grid, [c.value if hasattr(c, "value") else bytes(c) for c in launch.cells], s)))


def _fake_call(w, t, slots, per_slot=False, base=0, arch=None):
    from ptxgen.runtime.arrays import DeviceArray

    e, m, k = w.shape
    x = DeviceArray(0x100000000 + base, (t, slots, k) if per_slot else (t, k), np.dtype(np.float32))
    ids = DeviceArray(0x200000000 + base, (t, slots), np.dtype(np.int32))
    out = DeviceArray(0x300000000 + base, (t, slots, m), np.dtype(np.float32))
    mul_mat_id(w, x, ids, out=out, arch=arch)
    return x, ids, out


def _fake_experts(fmt="q4_K", e=8, m=64, k=256):
    from ptxgen.runtime.driver import DeviceBuffer
    from ptxgen.testing import fakegpu

    return QuantTensor(fmt, (e, m, k), device=DeviceBuffer.wrap(fakegpu.BASE, e * m * formats.get(fmt).row_bytes(k)))


def test_mul_mat_id_launches_patch_each_calls_pointers_and_evict_prefill_shapes(monkeypatch):
    """One prepared launch per (T, slots, x form, arch), patched per call with that call's x, y, ids (a second
    call at other addresses launches with those); grouped from 2 tokens, per pair for one token; the
    cache keeps at most PLANS_PER_WEIGHT shapes (the T > 8 ones go first)."""
    from ptxgen.runtime import ops

    rec = _Launches(monkeypatch)
    w = _fake_experts()
    for t, kernel, grid in ((1, "gemv_q4_k_f32_id", (4, 2, 1)), (4, "gemv_q4_k_f32_idg", (4, 8, 1)),
                            (40, "gemv_q4_k_f32_idg", (4, 4, 1))):  # 80 pairs: the gated GEMV behind the GEMM
        for base in (0, 0x1000):
            x, ids, out = _fake_call(w, t, 2, base=base)
            name, g, cells, _ = rec.runs[-1]
            assert (name, g) == (kernel, grid) and cells[1:3] == [x.ptr, out.ptr] and cells[8] == ids.ptr
    for t in range(9, 9 + ops.PLANS_PER_WEIGHT + 5):
        _fake_call(w, t, 2)
    assert len(w._plans) <= ops.PLANS_PER_WEIGHT and (1, "mul_mat_id", 2, 0, "exact", None, False) in w._plans


def test_a_workspace_reserved_for_expert_weights_holds_the_grouped_route(monkeypatch):
    """Workspace.reserve(w, T, slots=k) on expert weights sizes the scratch for mul_mat_id's plans (moe_group's
    order / offsets / work list and the gate), eager and captured; without slots it says what is missing."""
    from ptxgen.runtime import ops, plans

    _Launches(monkeypatch)
    w = _fake_experts(e=8, m=300, k=512)
    ws = plans.Workspace.__new__(plans.Workspace)  # sizes only: nothing allocated on the fake GPU
    ws.counter_bytes = ws.ready_bytes = ws.scratch_bytes = 0
    monkeypatch.setattr(plans.Workspace, "_alloc", lambda self, stream: None)
    monkeypatch.setattr(plans.driver, "synchronize", lambda: None)
    ws.stream = 0
    ws.reserve(w, [8, 300], slots=2)
    need = max(ops.mul_mat_id_plan(w, t, 2, x_per_slot=p).scratch_bytes for t in (8, 300) for p in (0, 1))
    assert need > 0 and ws.scratch_bytes >= need and ws.fits(ops.mul_mat_id_plan(w, 300, 2))
    with pytest.raises(ValueError, match="pass slots="):
        ws.reserve(w, 8)


def test_mul_mat_id_past_the_grouped_gemms_limits_is_one_grouped_gemv_launch(monkeypatch):
    """Past the grouped GEMM's limits (here 1025 experts: moe_group scans at most 1024), however many pairs (80000
    here), the grouped GEMV is one launch of (M rows, E experts): its CTAs scan the ids in windows; ntok is the pair
    count; ungated (0)."""
    rec = _Launches(monkeypatch)
    w = _fake_experts("q8_0", e=1025, m=16)
    x, ids, out = _fake_call(w, 40000, 2)
    (name, grid, cells, _), = rec.runs
    assert name == "gemv_q8_0_f32_idg" and grid == (1, 1025, 1) and cells[5] == 80000 and cells[11] == 0


def test_mul_mat_id_reads_an_fp16_x_through_twins_or_widens_it_once(monkeypatch):
    """mul_mat_id_plan(x_dtype="float16"): sm_90's routes run the float32 plan's kernels with their _x16 twins where
    they read x (the pair and grouped GEMVs, moe_gather(_sums): each value widened as it is loaded — the bits of the
    same values as fp32), the same launches otherwise (grids, the grouped GEMM); sm_89's grouped route (its mma.sync
    GEMM reads fp32 x) widens x once first (convert_f32). TQ4_1S's rotation reads it as it is (rotate_tq4_1s_f16,
    ROT_X16 | ROT_NO_F16). Cached apart from the float32 plans."""
    from ptxgen.kernels.gemv import ROT_NO_F16, ROT_X16
    from ptxgen.runtime import ops
    from ptxgen.testing import fakegpu

    fakegpu.install(monkeypatch)
    cases = [(fmt, _fake_experts(fmt, e=8, m=300, k=512), ((1, 0), (8, 0), (8, 1), (200, 1), (200, 0)))
             for fmt in ("q4_K", "q6_K", "tq4_1s")]
    # the grouped GEMV alone (pairs past moe_pair_max_weights, fewer than the GEMM's): 8 experts of 14336 x 4096,
    # T = 2-7 (its launch: grid.y the experts, the gate arguments)
    cases.append(("q4_K", _fake_experts("q4_K", e=8, m=14336, k=4096), ((3, 0), (7, 1))))
    for fmt, w, shapes in cases:
        for t, p in shapes:
            for arch in (None, "sm_89"):
                f32 = ops.mul_mat_id_plan(w, t, 2, x_per_slot=p, arch=arch)
                f16 = ops.mul_mat_id_plan(w, t, 2, x_per_slot=p, x_dtype="float16", arch=arch)
                if fmt == "tq4_1s":
                    assert f32.kernels[0] == "rotate_tq4_1s", f32.kernels
                    assert f16.kernels == ["rotate_tq4_1s_f16"] + f32.kernels[1:], f16.kernels
                    assert f16.launches[0].args[-1] == ROT_X16 | ROT_NO_F16
                elif "moe_group" in f32.kernels:  # (the mma.sync grouped GEMM, sm_89 or where sm_90a has none)
                    assert f16.kernels == ["convert_f32"] + f32.kernels, (fmt, t, p, f16.kernels)
                else:
                    assert f16.kernels == [n if "_wgmma_" in n else n + "_x16" for n in f32.kernels], f16.kernels
                    for a, b in zip(f32.launches, f16.launches):
                        assert a.grid == b.grid and len(a.args) == len(b.args), (f16.kernels, a.grid, b.grid)
                    f16.bound(fakegpu.FakeWorkspace(f16))  # (its launches' arguments fit the kernels')
                    for name, ln in zip(f16.kernels, f16.launches):  # the twins read the call's own x
                        reads_x = any(getattr(getattr(v, "ptr", None), "base", None) == "x" for v in ln.args)
                        assert reads_x == name.endswith("_x16"), (name, ln.args)
                assert ops.mul_mat_id_plan(w, t, 2, x_per_slot=p, arch=arch).kernels == f32.kernels
    with pytest.raises(TypeError, match="expected dtype float32 or float16, got float64"):
        ops.mul_mat_id_plan(w, 8, 2, x_dtype="float64")


def test_q4_k_from_16_pairs_runs_the_grouped_gemm_behind_moe_group(monkeypatch):
    """Q4_K from the tuning's moe_gemm_min_pairs pairs (sm_89's lowering: arch pinned): moe_group (one CTA) writes
    order / offsets / work; the grouped GEMM (persistent CTAs, at most one per possible item) reads them and raises
    the workspace's zero-kept flag on an fp16 overflow; the exact grouped GEMV after it is gated on that word (and
    lowers it, counting its CTAs in `done`). All three take this call's ids, x and y; the scratch is the
    workspace's."""
    from ptxgen.runtime import ops

    rec = _Launches(monkeypatch)
    w = _fake_experts(e=8, m=300, k=512)
    assert ops.mul_mat_id_plan(w, 7, 2).kernels[0] != "moe_group"  # 14 pairs: the grouped GEMV alone
    x, ids, out = _fake_call(w, 8, 2, arch="sm_89")
    names = [r[0] for r in rec.runs]
    assert names == ["moe_group", "mmq_q4_k_f16_n32_moe", "gemv_q4_k_f32_idg"]
    (_, g0, c0, _), (_, g1, c1, _), (_, g2, c2, _) = rec.runs
    assert g0 == (1, 1, 1) and c0[0] == ids.ptr and c0[1:4] == [16, 8, 32] and c0[7] == out.ptr
    order, offsets, work, gate = c0[4], c0[5], c0[6], c1[3]
    assert len(c0) == 9 and c1[:3] == [w.ptr, x.ptr, out.ptr] and c1[9:12] == [order, offsets, work]
    assert g1 == (min(3 * (16 // 32 + 8), g1[0]), 1, 1) and g1[0] <= 3 * 8
    assert c2[1:3] == [x.ptr, out.ptr] and c2[8] == ids.ptr and c2[11] == gate and g2[1] == 4  # GATED_EXPERT_CTAS
    assert c2[12] == gate + 4  # the workspace's flag, then its arrival count
    assert ops.mul_mat_id_plan(w, 200, 2, arch="sm_89").launches[1].fn.name == "mmq_q4_k_f16_n64_moe"  # 400 pairs ≥ 48
    # per expert


def test_q4_k_on_sm_90_gathers_x_then_runs_the_grouped_wgmma_gemm(monkeypatch):
    """On an H200 (no arch pinned) Q4_K's grouped route is moe_gather_sums (moe_group's grouping and x → fp16 in
    its order and the wgmma build's K order, into scratch, with the sub-block sums Σx the −m_lo MMA takes, one
    kernel; the gate is its overflow flag, the workspace's zero-kept word: a CTA an SM, 1024 groups of 8 a CTA at
    least), the register-A wgmma build reading the weights of all experts, the gathered x and its sums by tensor
    map (one CTA an SM, PDL behind the conversion), then the gated exact GEMV. Its token tile follows the pairs per
    expert (RULES.moe_wgmma_tile_pairs). The rule moe_int_weights_max_pairs (the integer-weight build at few pairs
    an expert) is pinned off here."""
    from ptxgen import tuning
    from ptxgen.runtime import ops

    rec = _Launches(monkeypatch)
    w = _fake_experts(e=8, m=300, k=512)
    with tuning.override(moe_int_weights_max_pairs=0):
        x, ids, out = _fake_call(w, 8, 2)
        plan = ops.mul_mat_id_plan(w, 8, 2)
    names = [r[0] for r in rec.runs]
    assert names == ["moe_gather_sums", "mmq_q4_k_wgmma_ra_n32_moe", "gemv_q4_k_f32_idg"]
    (_, g1, c1, _), (_, g2, c2, _), (_, _, c3, _) = rec.runs
    order, offsets, work, gate = c1[4], c1[5], c1[6], c1[11]
    assert c1[0] == ids.ptr and c1[1:4] == [16, 8, 32] and c1[7:10] == [out.ptr, 300, x.ptr]
    assert c1[12:16] == [512 // 8, 2, 0, 16] and g1 == (1, 1, 1)  # 16 pairs x 64 groups of 8: one CTA's round
    assert len(c1) == 17  # (moe_gather's 16, then the Σx scratch)
    assert [isinstance(c, bytes) for c in c2[:3]] == [True] * 3  # tmap_w, tmap_x, tmap_s (the sums)
    assert c2[3:9] == [out.ptr, 300, 512, order, offsets, work]
    assert g2 == (min(3 * (16 // 32 + 8), 132), 1, 1) and c3[11] == gate and c3[12] == gate + 4
    assert [ln.pdl for ln in plan.launches[:2]] == [True, True]  # moe_gather waits (pdl_head) before it reads
    for t, tile in ((95, "n32"), (96, "n48_m256"), (143, "n48_m256"), (144, "n64"), (239, "n64"), (240, "n80_m256"),
                    (511, "n80_m256"), (512, "n128")):
        # from 24 pairs per expert n48 (with 256-row M tiles), from 36 n64, from 60 n80 (256-row), from 128 n128
        plan = ops.mul_mat_id_plan(w, t, 2)
        assert plan.kernels[1] == f"mmq_q4_k_wgmma_ra_{tile}_moe"
        (_, g, c), p = plan.launches[0][:3], 2 * t  # a CTA an SM at most, ~1024 (pair, group) stores a CTA a round,
        # whole tokens (x's rows: each converted once for its 2 slots)
        assert c[15] == 2 * -(-t // min(132, -(-p * 64 // 1024))) and g == (-(-p // c[15]),)


def test_without_the_min_term_mma_the_gather_makes_no_sums(monkeypatch):
    """mmq.RA_MIN_LO_MMA (a build-time flag, on in emitted/): off, the grouped register-A GEMM decodes −m_lo in
    its fp16 fragments and takes no sub-block sums, so the route gathers with moe_gather (no Σx scratch) and the
    GEMM takes two tensor maps, then y."""
    from ptxgen import tuning
    from ptxgen.kernels import mmq
    from ptxgen.runtime import kernels, ops

    monkeypatch.setattr(mmq, "RA_MIN_LO_MMA", False)
    entry = kernels.entry
    monkeypatch.setattr(kernels, "entry", lambda k, a: kernels._built(k, a)[1] if k.endswith("_moe") else entry(k, a))
    kernels._built.cache_clear()
    rec = _Launches(monkeypatch)
    w = _fake_experts(e=8, m=300, k=512)
    with tuning.override(moe_int_weights_max_pairs=0):
        _fake_call(w, 8, 2)
    kernels._built.cache_clear()
    assert [r[0] for r in rec.runs] == ["moe_gather", "mmq_q4_k_wgmma_ra_n32_moe", "gemv_q4_k_f32_idg"]
    (_, _, c1, _), (_, _, c2, _) = rec.runs[:2]
    assert len(c1) == 16
    assert [isinstance(c, bytes) for c in c2[:3]] == [True, True, False]  # tmap_w, tmap_x, then y


def test_the_gather_takes_whole_rows_of_x_and_more_slots_than_a_cta_holds_take_moe_group(monkeypatch):
    """moe_gather converts a row of x once for every pair that shares it, so a CTA's pairs are whole tokens where the
    slots share x (rows a multiple of slots; per slot, any count): at 3 slots of 101 tokens, CTAs of 3·k pairs; past
    GATHER_ROWS slots a token no CTA holds one, and sm_90 takes the mma.sync grouped route (moe_group, any slots)."""
    from ptxgen import tuning
    from ptxgen.kernels.moe_group import GATHER_ROWS
    from ptxgen.runtime import ops

    _Launches(monkeypatch)
    w = _fake_experts(e=8, m=300, k=512)
    with tuning.override(moe_int_weights_max_pairs=0, moe_pair_max_weights=0):
        for slots, per_slot in ((3, 0), (3, 1), (5, 0)):
            plan = ops.mul_mat_id_plan(w, 101, slots, x_per_slot=per_slot)
            assert plan.kernels[0] == "moe_gather_sums"  # (with the sub-block sums: the −m_lo MMA's)
            rows = plan.launches[0][2][15]
            assert rows % (1 if per_slot else slots) == 0 and rows * plan.launches[0][1][0] >= 101 * slots
        assert ops.mul_mat_id_plan(w, 2, GATHER_ROWS + 1).kernels[0] == "moe_group"


def test_a_format_without_the_tile_reached_takes_its_largest_reached_tile():
    """RULES.moe_wgmma_tile_pairs names Q4_K's own tiles (n48_m256, n80_m256) beside every format's (n32, n64, n128):
    another format takes the largest tile reached that it has (n64 where Q4_K takes n80_m256, not n128), and where it
    has none reached, its next tile up (n64 where Q4_K takes n48_m256)."""
    from ptxgen.runtime import ops

    for per, q4k, other in ((20, "n32", "n32"), (30, "n48_m256", "n64"), (40, "n64", "n64"), (64, "n80_m256", "n64"),
                            (130, "n128", "n128")):
        for fmt, tile in (("q4_K", q4k), ("q6_K", other), ("q8_0", other)):
            assert ops._moe_wgmma_spec(32 * per, 32, fmt).name == f"mmq_{fmt.lower()}_wgmma_ra_{tile}_moe", (fmt, per)


def test_q6_k_experts_on_short_rows_take_the_row_group_build_under_its_rule(monkeypatch):
    """Q6_K experts whose rows are not 16-byte multiples (K = 768, Qwen3-30B-A3B's ffn_down_exps): under rule
    moe_row_groups (on: 3.2-3.7x on an H100) the grouped wgmma build on 8-row groups (mmq_q6_k_wgmma_ra_n*_g8_moe)
    where M is whole groups, its map over E·M / 8 group rows; off, or M not whole groups, the fp16 mma.sync grouped
    GEMM; rows of 16-byte multiples (K = 2048) the row build either way."""
    from ptxgen import tuning
    from ptxgen.runtime import ops, tma
    from ptxgen.testing import fakegpu

    fakegpu.install(monkeypatch)
    maps, encode = [], tma.tensor_map_2d
    monkeypatch.setattr(tma, "tensor_map_2d", lambda *a, **kw: maps.append(a) or encode(*a, **kw))
    short, ragged, whole = (_fake_experts("q6_K", 32, m, k) for m, k in ((2048, 768), (2044, 768), (768, 2048)))
    with tuning.override(moe_row_groups=False):
        assert ops.mul_mat_id_plan(short, 512, 4).kernels[1] == "mmq_q6_k_f16_n64_moe"
        assert ops.mul_mat_id_plan(whole, 512, 4).kernels[1] == "mmq_q6_k_wgmma_ra_n64_moe"
    with tuning.override(moe_row_groups=True):
        assert re.fullmatch(r"mmq_q6_k_wgmma_ra_n(32|64|128)_g8_moe", ops.mul_mat_id_plan(short, 512, 4).kernels[1])
        assert (short.ptr, "u8", 32 * 2048 // 8, 8 * 3 * 210, 16, 240, "none") in maps
        assert ops.mul_mat_id_plan(ragged, 512, 4).kernels[1] == "mmq_q6_k_f16_n64_moe"
        assert ops.mul_mat_id_plan(whole, 512, 4).kernels[1] == "mmq_q6_k_wgmma_ra_n64_moe"


@pytest.mark.parametrize("t,per_slot", [(1, False), (8, False), (8, True)])
def test_tq4_1s_rotates_x_once_and_every_kernel_reads_the_rotation(monkeypatch, t, per_slot):
    """TQ4_1S's experts hold rotated-domain weights: mul_mat_id launches rotate_tq4_1s first (x → scratch, every
    32-element block of every row: T or T x slots rows), then the pair GEMV or the grouped route on that scratch —
    no later kernel reads x."""
    rec = _Launches(monkeypatch)
    w = _fake_experts("tq4_1s", e=8, m=300, k=512)
    x, ids, out = _fake_call(w, t, 2, per_slot=per_slot)
    (n0, g0, c0, _), *rest = rec.runs
    rows = t * (2 if per_slot else 1)
    assert n0 == "rotate_tq4_1s" and c0[0] == x.ptr and c0[2] == rows * 512 // 32 and g0[0] == -(-c0[2] // 8)
    assert [r[0] for r in rest][-1] == ("gemv_tq4_1s_f32_id" if t == 1 else "gemv_tq4_1s_f32_idg")
    for name, _, cells, _ in rest:
        assert x.ptr not in cells and (c0[1] in cells or name.startswith("mmq_")), name  # the GEMM: x16 by map


def test_the_integer_weight_route_passes_the_sums_and_their_tensor_map(monkeypatch):
    """With rule moe_int_weights_max_pairs set, Q4_K's sm_90 route gathers x with its sub-block sums
    into a scratch of pairs x K / 16 halves and hands the n16 integer-weight build a third tensor map."""
    from ptxgen import tuning
    from ptxgen.runtime import ops

    rec = _Launches(monkeypatch)
    w = _fake_experts(e=8, m=300, k=512)
    shipped = ops.RULES.moe_int_weights_max_pairs["q4_K"]  # pairs an expert: the build up to this, n32 above
    assert ops.mul_mat_id_plan(w, 4 * shipped, 2).kernels[1] == "mmq_q4_k_wgmma_iw_n16_moe"
    assert ops.mul_mat_id_plan(w, 4 * shipped + 4, 2).kernels[1] == "mmq_q4_k_wgmma_ra_n32_moe"
    with tuning.override(moe_int_weights_max_pairs=16):
        x, ids, out = _fake_call(w, 8, 2)
        assert ops.mul_mat_id_plan(w, 8, 2).kernels[:2] == ["moe_gather_sums", "mmq_q4_k_wgmma_iw_n16_moe"]
        assert ops.mul_mat_id_plan(w, 80, 2).kernels[1] == "mmq_q4_k_wgmma_ra_n32_moe"  # 20 pairs an expert
    names = [r[0] for r in rec.runs]
    assert names == ["moe_gather_sums", "mmq_q4_k_wgmma_iw_n16_moe", "gemv_q4_k_f32_idg"]
    (_, _, c1, _), (_, _, c2, _) = rec.runs[0:2]
    assert len(c1) == 17 and all(isinstance(c, bytes) for c in c2[:3]) and c2[3] == out.ptr


def test_the_grouped_gemms_take_a_stages_activation_tiles_by_one_3d_box(monkeypatch):
    """The grouped wgmma builds' activation map is the gathered x16 seen as (64 columns, pairs, 64-column chunks):
    a box of BN pairs x the stage's chunks (meta x_box_chunks), one TMA a stage; the integer-weight build's Σx map
    likewise (8-column chunks hi and lo, s_box_chunks 2). Both are TMaps over scratch, encoded when bound."""
    from ptxgen import tuning
    from ptxgen.runtime import ops
    from ptxgen.runtime.plans import TMap

    _Launches(monkeypatch)
    w = _fake_experts(e=8, m=300, k=512)
    with tuning.override(moe_int_weights_max_pairs=16):
        for t, name, maps in ((80, "mmq_q4_k_wgmma_ra_n32_moe", 1), (8, "mmq_q4_k_wgmma_iw_n16_moe", 2)):
            gemm = ops.mul_mat_id_plan(w, t, 2).launches[1]
            assert gemm.fn.name == name
            tx, *ts = gemm.args[1:1 + maps]
            assert isinstance(tx, TMap) and (tx.rows, tx.cols, tx.box_cols) == (2 * t, 512, 64)
            assert tx.chunks == gemm.fn.meta["x_box_chunks"] == 4 and tx.box_rows == gemm.fn.meta["bn"]
            assert [(m.cols, m.box_cols, m.chunks) for m in ts] == ([(32, 8, 2)] if ts else [])


def test_mul_mat_id_first_calls_in_two_threads_each_launch_their_own_pointers(monkeypatch):
    """The first call of a shape prepares the launch and publishes it; a second thread finding it must not make the
    first launch with its pointers: patch and run happen as one step for every call, the first included."""
    import threading

    from ptxgen.runtime import ops

    rec = _Launches(monkeypatch)
    w = _fake_experts()
    real = ops._remember

    def slow_remember(*a):  # widen the window between publishing the launch and running it
        real(*a)
        if threading.current_thread().name == "A":
            other = threading.Thread(target=_fake_call, args=(w, 3, 2), kwargs={"base": 0x2000}, name="B")
            other.start()
            other.join()
    monkeypatch.setattr(ops, "_remember", slow_remember)
    th = threading.Thread(target=_fake_call, args=(w, 3, 2), name="A")
    th.start()
    th.join()
    xs = sorted(cells[1] for _, _, cells, _ in rec.runs)
    assert xs == [0x100000000, 0x100000000 + 0x2000]


@pytest.mark.parametrize("arch", ["sm_89", "sm_90a", "sm_120a"])
def test_moe_group_sorts_the_pairs_by_expert_and_lists_the_token_tiles(arch):
    """kernels/moe_group.py in the emulator: offsets and the work list exactly as its NumPy model, each expert's
    pairs (a permutation), NaN rows for bad ids — drawn routes, 128 experts with 700 x 8 pairs (tiles of 32),
    every pair on one expert, and no valid pair at all."""

    ptx = get_kernel("moe_group").for_arch(arch).ptx()
    cases = [dict(seed=s) for s in range(2)] + [
        dict(shape=(128, 700, 8, 3), tile=32), dict(ids=np.full((40, 2), 3, np.int32), shape=(4, 40, 2, 3), tile=16),
        dict(ids=np.full((3, 2), -1, np.int32), shape=(4, 3, 2, 3))]
    for kw in cases:
        out = check_kernel("moe_group", ptx, **kw)
        assert out.ok, out.detail


@pytest.mark.parametrize("name", ["moe_gather", "moe_gather_sums"])
def test_moe_gather_groups_the_pairs_and_gathers_x_bit_for_bit(name):
    """kernels/moe_group.py's moe_gather (_sums) in the emulator: moe_group's grouping (offsets and the work list
    exactly, each expert's slice of order a permutation of its pairs) written by CTAs that each place their own
    pairs, x16 rows bit for bit (and the sub-block sums), NaN rows for bad ids, the flag exactly on an fp16 overflow —
    drawn routes and CTA splits, x shared and per slot, 128 experts over 3 super-blocks of K, every pair on one expert
    and no valid pair at all."""

    ptx = get_kernel(name).for_arch("sm_90a").ptx()
    cases = [dict(seed=s) for s in range(3)] + [
        dict(shape=(128, 40, 8, 768), rows=56, tile=16, per_slot=False),  # 7 tokens' 8 slots a CTA, the last 5
        dict(ids=np.full((40, 2), 3, np.int32), shape=(4, 40, 2, 256), rows=80, per_slot=True),
        dict(ids=np.full((3, 2), -1, np.int32), shape=(4, 3, 2, 256), rows=2)]
    for kw in cases:
        out = check_kernel(name, ptx, **kw)
        assert out.ok, out.detail


def test_the_grouped_gemv_runs_only_through_an_open_gate():
    """gemv_<fmt>_f32_idg's gate (mul_mat_id's exact recompute behind the grouped GEMM): a zero word, nothing
    written; a raised one, the whole exact result — with grid.y = 2 < E = 5 too (each CTA loops over experts, as
    the gated launch runs, GATED_EXPERT_CTAS of them)."""
    for gate, fmt, ygrid in ((0, "q4_K", None), (1, "q4_K", None), (0, "q8_0", 2), (1, "q6_K", 2), (1, "q8_0", 1)):
        out = _case(fmt, "sm_90a", "idg", gate=gate, seed=gate, experts_grid=ygrid, shape=(5, 21, 512))
        assert out.ok, out.detail


@pytest.mark.parametrize("name,seed,per_slot", [("mmq_q4_k_f16_n32_moe", 1, False), ("mmq_q4_k_f16_n64_moe", 2, True),
                                                 ("mmq_q5_k_f16_n32_moe", 3, True), ("mmq_q6_k_f16_n64_moe", 4, False),
                                                 ("mmq_q8_0_f16_n32_moe", 5, True)])
def test_grouped_moe_gemm_matches_the_reference(name, seed, per_slot):
    """The grouped GEMM in the emulator (kernels/mmq_moe.py) on moe_group's grouping (any order inside an expert):
    an expert with more than a tile of pairs, an empty one, a bad id (its row untouched), x shared and per slot,
    three persistent CTAs taking turns; within 1e-3 of float64; the queue left zero. (sm_89's build here; the slow
    tier runs every target's on drawn seeds, with warps one at a time.)"""

    out = check_kernel(name, get_kernel(name).for_arch("sm_89").ptx(), seed=seed, x_per_slot=per_slot,
                       interleave=seed % 2 == 0)
    assert out.ok, out.detail


def test_grouped_moe_gemm_skewed_empty_and_overflowing():
    """Every pair on one expert (several token tiles), no valid pair at all (no items: the CTAs go home and the
    queue is reset), and an activation past fp16's range: the flag rises (mul_mat_id's gated GEMV recomputes)."""

    name = "mmq_q4_k_f16_n32_moe"
    ptx = get_kernel(name).for_arch("sm_89").ptx()
    out = check_kernel(name, ptx, seed=3, ids=np.full((40, 2), 2, np.int32))
    assert out.ok, out.detail
    out = check_kernel(name, ptx, seed=3, ids=np.full((3, 2), -1, np.int32))
    assert out.ok, out.detail
    out = check_kernel(name, ptx, seed=4, scale=1e5)
    assert not out.ok and "flag 1" in out.detail


@pytest.mark.parametrize("scale,arch", [(1.0, "sm_89"), (1e5, "sm_89"), (1.0, "sm_90a"), (1e5, "sm_90a")])
def test_the_grouped_route_end_to_end_in_the_emulator(scale, arch):
    """mul_mat_id's Q4_K route as ops records it (moe_group and the grouped GEMM — on sm_90 moe_gather_sums,
    grouping and x gathered into fp16 with its sub-block sums, and the register-A wgmma build —, the gated grouped
    GEMV), run in one emulated memory:
    within 1e-3 of float64
    (fp16 activations), NaN rows for the bad ids; with activations past fp16's range (scale 1e5) the GEMM or the
    conversion raises the gate and the GEMV recomputes every pair exactly (1e-5). Its 8 pairs an expert take the
    fp16-weight build here (rule moe_int_weights_max_pairs pinned off; the integer-weight route has its own test)."""
    from ptxgen import tuning

    rng = np.random.default_rng(7)
    ids = rng.integers(0, 4, (20, 2)).astype(np.int32)
    ids[3, 1], ids[11, 0] = -1, 5
    route = (["moe_gather_sums", "mmq_q4_k_wgmma_ra_n32_moe"] if arch == "sm_90a" else
             ["moe_group", "mmq_q4_k_f16_n32_moe"])
    with tuning.override(moe_int_weights_max_pairs=0):
        _grouped_route((5, 130, 512), ids, False, scale, arch, rng, [*route, "gemv_q4_k_f32_idg"])


@pytest.mark.parametrize("fmt", ["q5_K", "q8_0", "tq4_1s"])
def test_the_codecs_grouped_wgmma_route_in_the_emulator(fmt):
    """Q5_K's, Q8_0's and TQ4_1S's sm_90 route: their register-A decode in the grouped wgmma build (the dense GEMM's
    codec, moe_group's work list), x gathered first (TQ4_1S: x rotated before, as rotate_tq4_1s does), the gated
    GEMV after; within 1e-3 of float64, NaN rows for bad ids. (Q5_K's gather makes the sub-block sums of its −m_lo
    MMA.)"""
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 4, (20, 2)).astype(np.int32)
    ids[5, 0] = 4
    f = fmt.lower()
    _grouped_route((4, 130, 512), ids, True, 1.0, "sm_90a", rng,
                   ["moe_gather_sums" if fmt == "q5_K" else "moe_gather", f"mmq_{f}_wgmma_ra_n32_moe",
                    f"gemv_{f}_f32_idg"], fmt=fmt)


@pytest.mark.slow
@settings(max_examples=6, deadline=None)
@given(e=st.integers(1, 40), m=st.integers(1, 200), kb=st.integers(1, 2), t=st.integers(16, 90),
       slots=st.integers(1, 4), per_slot=st.booleans(), seed=st.integers(0, 2**31 - 1),
       arch=st.sampled_from(["sm_89", "sm_90a", "sm_120a"]),
       fmt=st.sampled_from(["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"]), load=st.sampled_from(EXPERT_LOADS))
def test_the_grouped_route_on_drawn_shapes(e, m, kb, t, slots, per_slot, seed, arch, fmt, load):
    """The route end to end on drawn (format, E, M, K, T, slots), x shared or per slot, routes drawn with repeats
    (uniform, all on one expert, a few with the rest empty, skewed) and one bad id: M below a tile and past it, one
    expert or many, both token tiles (BN 64 where pairs ≥ 48 per expert)."""
    rng = np.random.default_rng(seed)
    ids = _drawn_ids(rng, e, t, slots, load)
    ids.flat[int(rng.integers(ids.size))] = -1
    _grouped_route((e, m, 256 * kb), ids, per_slot, 1.0, arch, rng, fmt=fmt)


@pytest.mark.parametrize("scale", [1.0, 1e5])
def test_the_integer_weight_grouped_route_in_the_emulator(scale):
    """Q4_K's integer-weight route (rule moe_int_weights_max_pairs): moe_gather_sums (the grouping, x and its
    sub-block sums Σx hi / lo), mmq_q4_k_wgmma_iw_n16_moe (A = q·sc', d and
    the min term outside the K-step MMAs), the gated GEMV; K over 3 super-blocks, experts past one tile of pairs:
    within 1e-3 of float64, NaN rows for bad ids; x past fp16's range raises the gate and the GEMV recomputes."""
    from ptxgen import tuning

    rng = np.random.default_rng(13)
    ids = rng.integers(0, 3, (24, 2)).astype(np.int32)
    ids[2, 1] = -1
    with tuning.override(moe_int_weights_max_pairs=64):
        _grouped_route((4, 130, 768), ids, False, scale, "sm_90a", rng,
                       ["moe_gather_sums", "mmq_q4_k_wgmma_iw_n16_moe", "gemv_q4_k_f32_idg"])


@pytest.mark.parametrize("tile", ["n48", "n96", "n48_m256", "n64_m256", "n80_m256"])
def test_the_trial_token_tiles_grouped_route_in_the_emulator(tile):
    """Q4_K's grouped wgmma build at the token tiles between the shipped ones (kernels/mmq.py
    GROUPED_WGMMA_Q4K_TILES; n96's ring stages hold half a block) and with 256-row M tiles (GROUPED_WIDE_TILES: four
    consumer warpgroups), reached by naming them in rule moe_wgmma_tile_pairs: the route end to end, one expert past
    a tile of pairs, K over 3 super-blocks, M past a tile; within 1e-3 of float64, NaN rows for bad ids. The tiles
    on whole-block stages take the gather's sub-block sums for their −m_lo MMA; n96's half-block stages do not."""
    from ptxgen import tuning

    rng = np.random.default_rng(int(tile[1:3]))
    ids = rng.integers(0, 3, (70, 2)).astype(np.int32)
    ids[:55, 0] = 1  # expert 1: past one tile of pairs
    ids[4, 1] = -1
    m = 300 if "_m" in tile else 130  # (past one 256-row tile)
    with tuning.override(moe_int_weights_max_pairs=0, moe_wgmma_tile_pairs={tile: 1}):
        _grouped_route((3, m, 768), ids, False, 1.0, "sm_90a", rng,
                       ["moe_gather" if tile == "n96" else "moe_gather_sums", f"mmq_q4_k_wgmma_ra_{tile}_moe",
                        "gemv_q4_k_f32_idg"])


def test_a_setmaxnreg_split_past_the_launch_pool_is_refused_at_build(monkeypatch):
    """setmaxnreg moves registers inside the CTA's pool, fixed at launch (640 threads at 96 for the 256-row builds):
    a consumer increase the pool cannot serve spins forever — the 256-row n64 / n80 tiles hung so on an H100 at 120
    registers (2026-12-06; the emulator does not model the pool). The builder refuses such a split, and the trial
    tiles' 112 fits."""
    from ptxgen.kernels import mmq

    name = "mmq_q4_k_wgmma_ra_n80_m256_moe"
    assert "setmaxnreg.inc.sync.aligned.u32 112" in get_kernel(name).for_arch("sm_90a").ptx()
    monkeypatch.setattr(mmq, "WIDE_CONSUMER_REGS", 120)
    with pytest.raises(ValueError, match="setmaxnreg asks 64512 registers of a CTA launched with 640 x 96"):
        get_kernel(name).for_arch("sm_90a").ptx()


@pytest.mark.parametrize("variant", ["nodecode", "skeleton", "skeleton_noa_nob", "halfb"])
def test_the_skeleton_builds_drop_only_what_they_name(variant, monkeypatch):
    """kernels/mmq.py GROUPED_SKELETON (a timing-only diagnostic, never shipped): the n48 build without its decode,
    its MMAs or its loads still assembles and keeps the ring's barriers; "skeleton" has no K-step MMA left (the min
    term's and the epilogue's aside), "noa" / "nob" fewer TMA copies; off, the build is emitted/'s."""
    from ptxgen.kernels import mmq
    from ptxgen.runtime.compiler import compile_ptx

    name = "mmq_q4_k_wgmma_ra_n48_moe"
    base = get_kernel(name).for_arch("sm_90a").ptx()
    monkeypatch.setattr(mmq, "GROUPED_SKELETON", variant)
    ptx = get_kernel(name).for_arch("sm_90a").ptx()
    assert ptx != base and ptx.count("mbarrier.try_wait") == base.count("mbarrier.try_wait")
    assert (ptx.count("wgmma.mma_async") < base.count("wgmma.mma_async")) == variant.startswith("skeleton")
    assert (ptx.count("cp.async.bulk.tensor") < base.count("cp.async.bulk.tensor")) == ("no" in variant[1:])
    compile_ptx(ptx, "sm_90a", name=name)


@pytest.mark.parametrize("name", ["mmq_q4_k_wgmma_iw_n16_moe", "mmq_q4_k_wgmma_ra_n32_moe"])
def test_the_trace_build_records_every_item_once(name, monkeypatch):
    """kernels/mmq.py GROUPED_TRACE (bench/probe_moe_trace.py's diagnostic build, never shipped): each work item's
    record (CTA, SM, start, end) at y + 16·item, read back by the probe's own parser — every item once, each CTA's
    items in the order it ran them, every end after its start; the shipped build has no trace."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
    from probe_moe_trace import records, summarize
    from ptxgen.kernels import mmq

    assert "globaltimer" not in get_kernel(name).for_arch("sm_90a").ptx()
    monkeypatch.setattr(mmq, "GROUPED_TRACE", True)
    out = check_kernel(name, get_kernel(name).for_arch("sm_90a").ptx(), seed=5, ctas=3)
    items = int(out.detail.split(" entries, ")[1].split(" items")[0])
    words = np.asarray(out.got, np.float64).astype(np.float32).ravel().view(np.uint32)
    rec = records(words[:4 * items])  # (past them: the harness's poison; the probe zeroes y first)
    assert sorted(rec[:, 0]) == list(range(items)) and (rec[:, 4] > rec[:, 3]).all()
    assert set(rec[:, 1]) <= {0, 1, 2} and (rec[:, 2] == rec[:, 1]).all()  # the emulator: a CTA an SM
    for c in set(rec[:, 1]):
        mine = rec[rec[:, 1] == c]
        assert (np.diff(mine[np.argsort(mine[:, 3]), 4]) > 0).all()
    assert summarize(rec, 4)[0].startswith(f"{items} items")


@pytest.mark.parametrize("name", ["mmq_q4_k_wgmma_ra_n64_moe", "mmq_q4_k_wgmma_ra_n96_moe"])
def test_the_static_block_steps_give_the_run_time_tests_bits(name, monkeypatch):
    """codecs.q4_k.RA_STATIC_STEPS (shipped; False for A/B probes): the grouped builds' register-A decode with the
    block's scales decoded at its step 0 without the run-time test, each step's pick by a constant — the same y bit
    for bit, with fewer instructions."""
    from ptxgen.codecs import q4_k

    outs = []
    for static in (False, True):
        monkeypatch.setattr(q4_k, "RA_STATIC_STEPS", static)
        ptx = get_kernel(name).for_arch("sm_90a").ptx()
        assert ("ra_block_kept" in ptx) != static
        out = check_kernel(name, ptx, seed=3)
        assert out.ok, out.detail
        outs.append(np.asarray(out.got).view(np.uint32))
    np.testing.assert_array_equal(outs[0], outs[1])


def _grouped_route(shape, ids, per_slot, scale, arch, rng, want_route=None, fmt="q4_K"):
    from ptxgen import tuning
    from ptxgen.emu.harness import BACKEND, _memory, _moe_x, _run, weight_rows_map
    from ptxgen.runtime import ops

    e, m, k = shape
    t, slots = ids.shape
    raw = formats.quantize(fmt, rng.standard_normal((e * m, k)).astype(np.float32))
    x = (rng.standard_normal((t, slots, k) if per_slot else (t, k)) * scale).astype(np.float32)
    with tuning.override(moe_gemm_min_pairs=1):  # the GEMM route whatever the format's threshold
        route = ops.mul_mat_id_kernels(fmt, t, slots, e, k, m, sm=90 if arch == "sm_90a" else 89)
    if fmt == "tq4_1s":  # its rotation first: the kernels below read x rotated (formats.rht_forward, bit for bit)
        assert route[0] == "rotate_tq4_1s"
        route = route[1:]
    assert (want_route is None or route == want_route) and len(route) == 3
    group, gemm, idg = (get_kernel(n).for_arch(arch) for n in route)
    p, bn, eb = t * slots, gemm.meta["bn"], m * formats.get(fmt).row_bytes(k)
    mem = _memory()
    wa, xa, ia = mem.alloc(raw), mem.alloc(_moe_x(fmt, x)), mem.alloc(ids)
    ya, qa = mem.alloc(p * m * 4, poison=0x11), mem.alloc(8, poison=0)
    oa, fa, ka = mem.alloc(4 * p, poison=0xFF), mem.alloc(4 * (e + 1), poison=0xFF), mem.alloc(4 * (1 + p // bn + e))
    ga = mem.alloc(8, poison=0)  # the workspace's flag and its arrival count: zero-kept
    grouping = (ia, p, e, bn, oa, fa, ka, ya, m)
    if route[0].startswith("moe_gather"):  # sm_90: grouping and x into fp16 in one kernel, the wgmma build on maps
        x16 = mem.alloc(p * k * 2, poison=0xFF)
        iw = "int_weights" in gemm.meta or "min_lo_sums" in gemm.meta  # the integer-weight build or the −m_lo MMA:
        # the gather writes the sub-block sums too
        xs = mem.alloc(p * k // 16 * 2, poison=0xFF) if iw else None
        unit = 1 if per_slot else slots  # whole rows of x a CTA
        rows = unit * max(1, p // unit // 3)  # 3 or 4 CTAs
        _run(group.ptx(), (-(-p // rows),), (1024,), grouping + (xa, x16, ga, k // 8, slots, int(per_slot), rows)
             + ((xs,) if iw else ()), mem)
        tw = weight_rows_map(mem, wa, gemm.meta, e * m, formats.get(fmt).row_bytes(k))  # the build's boxes
        tx = BACKEND[-1].tensor_map(mem, x16, "f16", p, k, bn, 64, "128B", None, gemm.meta.get("x_box_chunks", 0))
        ts = ((BACKEND[-1].tensor_map(mem, xs, "f16", p, k // 16, bn, 8, "none", None,
                                      gemm.meta.get("s_box_chunks", 0)),) if iw else ())
        _run(gemm.ptx(), (2,), (32 * gemm.meta["warps"],), (tw, tx, *ts, ya, m, k, oa, fa, ka, qa), mem,
             dynamic_smem=gemm.meta["dynamic_smem"])
    else:
        _run(group.ptx(), (1,), (1024,), grouping, mem)
        _run(gemm.ptx(), (3,), (256,), (wa, xa, ya, ga, m, k, slots, int(per_slot), eb, oa, fa, ka, qa), mem,
             dynamic_smem=gemm.meta["dynamic_smem"])
    raised = int(mem.view(ga, np.uint32, (2,))[0])
    gates = min(e, 4)  # as ops launches it: GATED_EXPERT_CTAS
    _run(idg.ptx(), (-(-m // idg.meta["rows_per_cta"]), gates), (32 * idg.meta["warps"],),
         (wa, xa, ya, m, k, p, e, eb, ia, slots, int(per_slot), ga, ga + 4), mem)
    got = mem.view(ya, np.float32, (t, slots, m)).astype(np.float64)
    want = formats.mul_mat_id_ref(fmt, raw, (e, m, k), x, ids)
    bad = np.isnan(want)
    assert np.isnan(got[bad]).all() and np.isfinite(got[~bad]).all()
    assert rel(got[~bad], want[~bad]) <= (1e-5 if scale > 1 else 1e-3)
    assert raised == int(scale > 1) and not mem.view(ga, np.uint32, (2,)).any()  # raised, then lowered


@pytest.mark.parametrize("fmt", ["q5_K", "q6_K"])
def test_run32_is_four_run8s_bit_for_bit(fmt):
    """A codec's run32 (the MoE GEMM's A decode: one sub-block's header once) against four run8 calls (the prepared
    fragments' decode, bit-checked against NumPy there) on every 32-weight run of drawn GGUF blocks, in the
    emulator: identical float32 bits, NaN / inf included."""
    from ptxgen import codecs
    from ptxgen.arch import get_arch
    from ptxgen.builder import KernelBuilder
    from ptxgen.emu.harness import _memory, _run
    from ptxgen.ir import Imm, Mem
    from ptxgen.testing.strategies import random_raw

    codec, k = codecs.get(fmt), 512
    b = KernelBuilder("run32_vs_run8", get_arch("sm_89"), "test", block=(32, 1, 1))
    w_p, a_p, c_p = b.param("w", "u64", "ptr:in"), b.param("a", "u64", "ptr:out"), b.param("c", "u64", "ptr:out")
    W, A, C = b.ptr(w_p), b.ptr(a_p), b.ptr(c_p)
    tid = b.special("tid.x")
    row = b.op("mad.wide.u32", b.op("shr.u32", tid, Imm(4, "u32")), Imm(k // codec.BLOCK_K * codec.BLOCK_BYTES, "u32"),
               W)  # 2 rows of 16 runs
    k0 = b.op("shl.b32", b.op("and.b32", tid, Imm(15, "b32")), Imm(5, "u32"))
    one = codec.run32(b, row, k0)
    four = [v for r in range(4) for v in codec.run8(b, row, b.op("add.u32", k0, Imm(8 * r, "u32")))]
    for out, vals in ((A, one), (C, four)):
        base = b.op("mad.wide.u32", tid, Imm(128, "u32"), out)
        for i, v in enumerate(vals):
            b.emit("st.global.f32", Mem(base, 4 * i), v)
    b.emit("ret")
    raw = random_raw(fmt, 2, k, np.random.default_rng(3), scale=(-1e3, 1e3))
    raw.reshape(-1)[:2] = 0xFF  # a NaN d in the first block
    mem = _memory()
    wa, aa, ca = mem.alloc(raw), mem.alloc(32 * 128, poison=0x11), mem.alloc(32 * 128, poison=0x22)
    _run(b.finish().ptx(), (1,), (32,), (wa, aa, ca), mem)
    got, want = mem.view(aa, np.uint32, (32, 32)), mem.view(ca, np.uint32, (32, 32))
    np.testing.assert_array_equal(got, want)


def test_from_two_tokens_the_pair_gemv_runs_up_to_its_weights_rule(monkeypatch):
    """From 2 tokens mul_mat_id runs the one-token GEMV over every (token, slot) pair (each reads its expert) while
    pairs x M x K ≤ RULES.moe_pair_max_weights, then the grouped routes; one token always the pair GEMV."""
    from ptxgen import tuning
    from ptxgen.runtime import ops

    limit = 1 << 26
    with tuning.override(moe_pair_max_weights=limit):
        for fmt in ("q4_K", "q8_0"):
            f = fmt.lower()
            t = limit // (8 * 768 * 2048)  # 128 experts top-8 768 x 2048: T = 5
            assert ops.mul_mat_id_kernels(fmt, t, 8, 128, 2048, 768, sm=90) == [f"gemv_{f}_f32_id"]
            assert ops.mul_mat_id_kernels(fmt, t + 1, 8, 128, 2048, 768, sm=90)[1] in (  # Q4_K: integer weights
                f"mmq_{f}_wgmma_ra_n32_moe", f"mmq_{f}_wgmma_iw_n16_moe")
            assert ops.mul_mat_id_kernels(fmt, 1, 64, 128, 2048, 768, sm=90) == [f"gemv_{f}_f32_id"]
        assert ops.mul_mat_id_kernels("q6_K", 2, 2, 4, 256, 64, sm=89) == ["gemv_q6_k_f32_id"]
        rec = _Launches(monkeypatch)
        w = _fake_experts(e=8, m=300, k=512)
        x, ids, out = _fake_call(w, 3, 2)
        (name, grid, args, _), = rec.runs
        assert name == "gemv_q4_k_f32_id" and grid[1] == 6 and args[5] == 1 and args[8] == ids.ptr
