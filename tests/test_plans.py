"""The runtime's launch plans and streams without a GPU (ptxgen.testing.fakegpu: an H200-shaped context, kernels as their
manifests say): which kernels mul_mat plans, when a cached plan is reused or rebuilt, how a plan binds to a
workspace, and how `stream=` is read."""
import ctypes
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ptxgen.testing import fakegpu
from ptxgen import knobs, tuning
from ptxgen.kernels import gemv_codec, mmq
from ptxgen.kernels.gemv import ROT_REGA, ROT_X16
from ptxgen.specs import GemvKernel
from ptxgen.runtime import driver, kernels, ops, plans
from ptxgen.runtime.driver import PER_THREAD_STREAM, stream_handle


@pytest.fixture
def gpu(monkeypatch):
    return fakegpu.install(monkeypatch)


# --- which kernels ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,m,k,t,mode,kernels", [
    ("q4_K", 4096, 14336, 1, "exact", ["gemv_q4_k_i8_t1_fused"]),
    ("q4_K", 4096, 14336, 3, "exact", ["gemv_q4_k_mma_t4_fused"]),
    ("q4_K", 4096, 14336, 8, "exact", ["prep_q4k_t8", "gemv_q4_k_mma_t8"]),
    ("q4_K", 18944, 3584, 8, "exact", ["prep_mma_f16", "gemv_q4_k_mma"]),  # t8's row CTAs: past one round
    ("q4_K", 4096, 14336, 16, "exact", ["prep_q4k_t16h", "gemv_q4_k_mma_t16h"]),
    ("q4_K", 4096, 14336, 32, "exact", ["prep_q4k_t32h", "mmq_q4_k_rega_n32"]),
    ("q4_K", 4096, 14336, 512, "exact", ["convert_f16", "mmq_q4_k_wgmma_ra_n256_cs", "mul_mat_fixup_q4_k"]),
    ("q4_K", 4096, 14336, 4096, "exact", ["mmq_q4_k_wgmma_ra_n256_cx", "mul_mat_fixup_q4_k"]),
    ("q4_K", 4096, 4096, 16, "fast", ["mmq_q4_k_q8_n16", "mul_mat_fixup_q4_k"]),
    ("tq4_1s", 18944, 3584, 1, "exact", ["prep_tq4_1s", "gemv_tq4_1s_tma_t1"]),
    ("tq4_1s", 18944, 3584, 8, "exact", ["prep_tq4_1s_mma", "gemv_tq4_1s_mma"]),
    ("q8_0", 4096, 4096, 4, "fast", ["prep_q8_lanes", "gemv_q8_0_t4"]),
])
def test_mul_mat_plans_the_kernels_of_the_dispatch_rule(gpu, fmt, m, k, t, mode, kernels):
    """The README's dispatch on an H200, as plans: every GEMM on fp16 / Q8_1 activations is followed by the fixup
    that reads the overflow flag on the device (no host read-back)."""
    p = ops.mul_mat_plan(fakegpu.weights(fmt, m, k), t, mode=mode)
    assert p.kernels == kernels
    # an op's first kernel overlaps the previous op's last one only if it waits before touching memory
    assert p.launches[0].pdl is bool(p.launches[0].fn.meta.get("pdl_head"))


def test_fp16_x_on_the_mma_sync_gemm_takes_its_x16_build_at_every_size(gpu):
    """The fp16 mma.sync GEMM (sm_89 / sm_120a, or arch pinned there): for an fp32 x its converting build below
    mmq_x16_min_work and convert_f16 + its _x16 build above; for an fp16 x the _x16 build at every size (x as it is:
    no launch before it, no fixup; the emulator gives the converting build's bits on the same fp16 values) where
    that build ships."""
    for fmt in ("q6_K", "q8_0", "q5_K"):
        w = fakegpu.weights(fmt, 1024, 4096)
        for t in (40, 64, 100):
            f32 = ops.mul_mat_plan(w, t, arch="sm_89").kernels
            if not any(n.startswith(f"mmq_{fmt.lower()}_f16_n") for n in f32):
                continue
            gemm = next(n for n in f32 if n.startswith("mmq_"))
            f16 = ops.mul_mat_plan(w, t, arch="sm_89", x_dtype="float16").kernels
            assert f16 == [gemm if gemm.endswith("_x16") else gemm + "_x16"], (fmt, t, f32, f16)


def test_fast_mode_pinned_to_sm90a_skips_the_int8_mmq_it_has_no_build_for(gpu):
    """mode="fast" at 9-16 tokens runs Q4_K's int8 MMQ (mmq_q4_k_q8_n16: mma.sync, built for sm_89 / sm_120a, which
    an H200 runs where no arch is pinned); with arch="sm_90a" pinned there is no such build, so the call takes the
    exact routes (it raised "no 'q8' GEMM build" before 2026-12-05)."""
    w = fakegpu.weights("q4_K", 4096, 4096)
    for t in (9, 16):
        assert ops.mul_mat_plan(w, t, mode="fast").kernels[0] == "mmq_q4_k_q8_n16"
        assert ops.mul_mat_plan(w, t, mode="fast", arch="sm_90a").kernels == ops.mul_mat_plan(w, t, arch="sm_90a").kernels


def test_the_fixup_launches_its_rules_ctas_per_sm(gpu):
    """mul_mat_fixup_<fmt> behind a prefill GEMM: min(T, fixup_ctas_per_sm x SMs) CTAs (the rule; one wave at 1)."""
    from ptxgen import tuning

    w = fakegpu.weights("q4_K", 4096, 4096)
    sms = driver.current().sm_count
    for per, t in ((4, 512), (1, 512), (1, 64), (4, 100)):
        with tuning.override(fixup_ctas_per_sm=per):
            p = ops.mul_mat_plan(w, t)
            assert p.kernels[-1] == "mul_mat_fixup_q4_k", p.kernels
            assert p.launches[-1].grid == (min(t, per * sms),), (per, t, p.launches[-1].grid)


def _build_t(t: int) -> int:
    """The GEMV build a slice of t tokens runs (1, 2, 4, 8)."""
    return next(v for v in ops.GEMV_TOKENS if v >= t)


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"])
@pytest.mark.parametrize("arch", [None, "sm_89", "sm_120a"])
def test_fast_mode_runs_every_format_at_every_t(gpu, fmt, arch):
    """mode="fast" for every format: the int8 x Q8_1 kernels where the format has them and they measured faster
    (the lane GEMV up to the rule fast_lanes_max_tokens; Q4_K's int8 MMQ above 8 tokens), otherwise the format's
    exact routes — the same plan as mode="exact" (no slices of the 8-token GEMV: T = 512 is one GEMM)."""
    from ptxgen import codecs, tuning

    w = fakegpu.weights(fmt, 4096, 4096)
    lanes_to = tuning.for_sm(90).fast_lanes_max_tokens[fmt]
    for t in (1, 2, 4, 5, 8, 9, 40, 512):
        fast, exact = ops.mul_mat_plan(w, t, mode="fast", arch=arch), ops.mul_mat_plan(w, t, arch=arch)
        lane = kernels.build_for(GemvKernel("gemv", fmt, 1, fast=True).name, arch) is not None
        if t <= lanes_to and lane:
            assert fast.kernels[-1] == GemvKernel("gemv", fmt, _build_t(t), fast=True).name, (t, fast.kernels)
        elif not (fmt == "q4_K" and ops.q8_path(t, ops.mmq_path(arch))):
            assert fast.kernels == exact.kernels, (t, fast.kernels, exact.kernels)
    with tuning.override(fast_lanes_max_tokens=8):  # every lane GEMV to 8 tokens (the GPU tests' setting)
        for t in (1, 5, 8):
            fast = ops.mul_mat_plan(w, t, mode="fast", arch=arch)
            if kernels.build_for(GemvKernel("gemv", fmt, 1, fast=True).name, arch) is not None:
                assert fast.kernels[-1] == GemvKernel("gemv", fmt, _build_t(t), fast=True).name, (t, fast.kernels)
    assert "fast_lanes" in codecs.get(fmt).ROUTES["fast"]


def test_fast_mode_runs_the_exact_kernels_on_weights_the_int8_gemv_cannot_take(gpu):
    """Q8_0's int8 GEMV reads 4-byte words over pairs of blocks (K a multiple of 64, the pointer 4-byte aligned):
    other Q8_0 weights run the exact kernels in mode="fast" instead of failing."""
    for w in (fakegpu.weights("q8_0", 256, 96), fakegpu.weights("q8_0", 256, 256, at=fakegpu.BASE + 2)):
        assert ops.mul_mat_plan(w, 2, mode="fast").kernels == ops.mul_mat_plan(w, 2).kernels


@pytest.fixture
def all_lanes():
    """Every format's lane GEMV to 8 tokens in mode="fast" (the rule fast_lanes_max_tokens runs Q5_K's and Q6_K's
    nowhere on the H200: slower than their exact GEMVs there)."""
    from ptxgen import tuning

    with tuning.override(fast_lanes_max_tokens=8):
        yield


def test_fast_mode_lane_gemvs_take_the_weights_their_loads_suit(gpu, all_lanes):
    """Q5_K's and Q6_K's int8 lane GEMVs (mode="fast", T ≤ 8): Q5_K's 16-byte loads want 16-byte aligned weights,
    Q6_K's word runs K a multiple of 512 (rows 4-byte aligned); other weights run the exact kernels."""
    assert ops.mul_mat_plan(fakegpu.weights("q5_K", 256, 512), 1, mode="fast").kernels == ["prep_q8_lanes",
                                                                                          "gemv_q5_k_fast_t1"]
    assert ops.mul_mat_plan(fakegpu.weights("q6_K", 256, 1024), 3, mode="fast").kernels == ["prep_q8_lanes",
                                                                                           "gemv_q6_k_fast_t4"]
    for w in (fakegpu.weights("q5_K", 256, 512, at=fakegpu.BASE + 8), fakegpu.weights("q6_K", 256, 768),
              fakegpu.weights("q6_K", 256, 1024, at=fakegpu.BASE + 2)):
        assert ops.mul_mat_plan(w, 1, mode="fast").kernels == ops.mul_mat_plan(w, 1).kernels


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"])
def test_weights_past_fp16_run_the_fp32_kernels(gpu, fmt):
    """A tensor whose blocks' scale fields let a weight leave fp16's range (QuantTensor.max_scale past
    formats.fp16_weight_scale) runs no kernel that holds weights in fp16 — no GEMM but Q4_K's int8 one (integer
    weights, fp32 scales): the fp32 GEMVs at every T, both modes, and mul_mat_id without its grouped GEMM — where
    a tensor at the bound runs the GEMMs."""
    from ptxgen import formats

    edge = formats.fp16_weight_scale(fmt)
    fine = ops.mul_mat_plan(fakegpu.weights(fmt, 4096, 4096, max_scale=edge), 512).kernels
    assert any(n.startswith("mmq_") for n in fine), fine
    for t in (16, 40, 512):
        for mode in ("exact", "fast"):
            big = ops.mul_mat_plan(fakegpu.weights(fmt, 4096, 4096, max_scale=2 * edge), t, mode=mode).kernels
            fp16 = [n for n in big if n.startswith(("mmq_", "mul_mat_fixup")) and not n.startswith("mmq_q4_k_q8_")]
            assert not fp16 or big == ["mmq_q4_k_q8_n16", "mul_mat_fixup_q4_k"], (t, mode, big)
    e, m, k = 32, 1792, 2048
    assert any(n.startswith("mmq_") for n in ops.mul_mat_id_kernels(fmt, 512, 4, e, k, m))
    big = ops.mul_mat_id_kernels(fmt, 512, 4, e, k, m, fp16_weights=False)
    assert not any(n.startswith(("mmq_", "moe_")) for n in big), big


def test_pdl_head_kernels_wait_before_touching_memory():
    """A kernel the plans launch with PDL as an op's first (meta pdl_head) may start while the kernel before it in
    the stream (anyone's) still runs: in its emitted PTX nothing reads or writes memory before griddepcontrol.wait;
    and the kernels that end a decode op trigger their dependents first thing."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "emitted" / "sm_90a"
    manifest = json.loads((root / "manifest.json").read_text())
    heads = {k["kernel"]: k["meta"]["pdl_head"] for k in manifest["kernels"] if k["meta"].get("pdl_head")}
    assert {"prep_q4k_t1", "prep_f32_lanes", "prep_tq4_1s", "convert_f16_perm", "gemv_q4_k_mma_t1_fused"} <= set(heads)
    memory = re.compile(r"^\s*(@!?%\w+\s+)?(ld|st|atom|red|cp|tex|prefetch|mbarrier)\.(?!param)")
    for name, what in heads.items():
        body = (root / f"{name}.ptx").read_text().split("{", 1)[1].splitlines()
        wait = next(i for i, line in enumerate(body) if "griddepcontrol.wait" in line)
        early = [line for line in body[:wait] if memory.match(line)]
        if what == "weights":  # only the weights' cp.async copies (weights are never written by a kernel)
            assert early and all("cp.async" in line for line in early), name
        else:
            assert what is True and not early, name
    for name in ("gemv_q4_k_mma_t1", "gemv_q4_k_t1", "gemv_tq4_1s_tma_t1", "mul_mat_fixup_q4_k"):
        body = (root / f"{name}.ptx").read_text().split("{", 1)[1]
        assert body.index("griddepcontrol.launch_dependents") < min(body.index(op) for op in ("ld.global", "cp.async")
                                                                   if op in body), name


def test_mul_mat_on_the_mma_sync_target_plans_the_mma_sync_gemm(gpu):
    p = ops.mul_mat_plan(fakegpu.weights("q4_K", 4096, 4096), 512, arch="sm_89")
    assert p.kernels[-2:] == ["mmq_q4_k_f16_n128_x16", "mul_mat_fixup_q4_k"] and p.kernels[0] == "convert_f16"


def test_sm120_mma_sync_gemm_takes_tensor_maps(monkeypatch):
    """On an sm_120 device the fp16 mma.sync MMQ is the sm_120a build, whose ring is TMA: the plan passes the
    weights' tensor map (encoded while recording) where the sm_89 build takes the pointer, and behind convert_f16 a
    map over the fp16 x in scratch (a TMap, encoded when the plan is bound); fp32 x stays a pointer."""
    from ptxgen.runtime.driver import Context

    sm120 = Context(device=0, ctx=None, name="fake sm_120", sm=120, sm_count=84, max_smem_optin=99 * 1024,
                    l2_bytes=64 << 20)
    fakegpu.install(monkeypatch, sm120)
    w = fakegpu.weights("q4_K", 4096, 4096)
    for t, x16 in ((512, True), (100, False)):
        with tuning.override(mmq_x16_min_work=4096 * 4096 * 256):  # fp16 x from 256 tokens
            p = ops.mul_mat_plan(w, t)
        gemm = next(ln for ln in p.launches if ln.fn.name.startswith("mmq_q4_k_f16_"))
        assert gemm.fn.arch == "sm_120a" and gemm.fn.name.endswith("_x16") == x16, p.kernels
        assert [q["name"] for q in gemm.fn.params[:2]] == ["tmap_w", "tmap_x" if x16 else "x"]
        assert isinstance(gemm.args[0], bytes) and isinstance(gemm.args[1], plans.TMap) == x16
        b = p.bound(fakegpu.FakeWorkspace(p))
        assert bytes(b.launches[p.launches.index(gemm)].cells[1]) == (bytes(128) if x16 else bytes(8))
    with tuning.override(mmq_x16_min_work=4096 * 4096 * 256):  # an fp16 x: the map is over the call's x itself
        p = ops.mul_mat_plan(w, 512, x_dtype="float16")
    assert p.kernels == ["mmq_q4_k_f16_n128_x16"] and p.launches[0].args[1].ptr.base == "x"


def test_sliced_calls_reuse_their_scratch(gpu):
    """TQ4_1S above 8 tokens where no GEMM runs (here: their thresholds raised) takes the decode GEMV in slices
    of 8: every slice reuses the same scratch (each starts with a launch that waits for the previous slice), so the
    workspace does not grow with T."""
    from ptxgen import tuning

    w = fakegpu.weights("tq4_1s", 18944, 3584)
    with tuning.override(codec_mmq_min_tokens=1 << 30,
                         codec_ra_mmq_min_tokens=dict(ops.RULES.codec_ra_mmq_min_tokens, tq4_1s=1 << 30)):
        p8, p4096 = ops.mul_mat_plan(w, 8), ops.mul_mat_plan(w, 4096)
    assert len(p4096.launches) == 512 * len(p8.launches)
    assert p4096.scratch_bytes == p8.scratch_bytes
    slice_starts = [ln for i, ln in enumerate(p4096.launches) if i % 2 == 0]
    assert all(ln.fn.meta.get("pdl_head") or not ln.pdl for ln in slice_starts)


# --- the plan cache -----------------------------------------------------------------------------------------

def test_plans_are_cached_per_weights_tokens_and_knobs(gpu, monkeypatch):
    w = fakegpu.weights("q4_K", 4096, 14336)
    a = ops.mul_mat_plan(w, 1)
    assert ops.mul_mat_plan(w, 1) is a  # the same call: the cached plan
    assert ops.mul_mat_plan(w, 2) is not a and ops.mul_mat_plan(w, 2).kernels[-1] == "gemv_q4_k_i8_t2_fused"
    assert ops.mul_mat_plan(w, 1, mode="fast") is not a  # mode is part of the key
    other = fakegpu.weights("q4_K", 4096, 14336, at=fakegpu.BASE + (1 << 30))
    b = ops.mul_mat_plan(other, 1)
    assert b is not a and b.launches[-1].args[0] is other.buffer  # plans live on (and point at) their weights
    loaded = len(gpu)
    with knobs.override(PTXGEN_Q4K_T1="0"):  # a knob change: a new plan, with the knob's kernels
        c = ops.mul_mat_plan(w, 1)
        assert c is not a and c.kernels == ["prep_mma_f16", "gemv_q4_k_mma"]
        assert ops.mul_mat_plan(w, 1) is c
    assert len(gpu) > loaded
    d = ops.mul_mat_plan(w, 1)  # back to the environment's value: rebuilt, the first choice again
    assert d is not c and d.kernels == a.kernels


def test_a_weights_plan_cache_is_bounded_and_keeps_its_decode_plans(gpu, monkeypatch):
    """Prefill lengths vary per request: past PLANS_PER_WEIGHT plans a QuantTensor drops its T > 8 ones, never the
    decode plans a generation loop reuses."""
    monkeypatch.setattr(ops, "PLANS_PER_WEIGHT", 8)
    w = fakegpu.weights("q4_K", 256, 512)
    one = ops.mul_mat_plan(w, 1)
    for t in range(9, 40):
        ops.mul_mat_plan(w, t)
        assert len(w._plans) <= 8
    assert ops.mul_mat_plan(w, 1) is one


def test_graph_plans_keep_the_prep_kernel_eager_plans_fuse_it(gpu):
    """Exact Q4_K at 1-4 tokens: eager calls run one kernel (the host issues every launch), captured calls the prep
    and the GEMV (faster on the GPU, overlapped by PDL; the same bits): two plans, cached apart — the int8 builds
    (1-2 tokens, rule few_i8_max_tokens) and the fp16 ones alike."""
    w = fakegpu.weights("q4_K", 4096, 14336)
    for t, nt, kind, prep in ((1, 1, "i8", "prep_q4k_i8"), (2, 2, "i8", "prep_q4k_i8"), (3, 4, "mma", "prep_q4k")):
        eager, graph = ops.mul_mat_plan(w, t), ops.mul_mat_plan(w, t, graph=True)
        assert eager.kernels == [f"gemv_q4_k_{kind}_t{nt}_fused"]
        assert graph.kernels == [f"{prep}_t{nt}", f"gemv_q4_k_{kind}_t{nt}"] and graph is not eager
        assert ops.mul_mat_plan(w, t, graph=True) is graph
    with knobs.override(PTXGEN_Q4K_FUSED="1"):
        assert ops.mul_mat_plan(w, 1, graph=True).kernels == ["gemv_q4_k_i8_t1_fused"]
    with knobs.override(PTXGEN_Q4K_FUSED="0"):
        assert ops.mul_mat_plan(w, 1).kernels == ["prep_q4k_i8_t1", "gemv_q4_k_i8_t1"]
        with tuning.override(few_i8_max_tokens={"q4_K": 0}):
            assert ops.mul_mat_plan(w, 1).kernels == ["prep_q4k_t1", "gemv_q4_k_mma_t1"]


def test_knobs_are_read_once_and_changed_in_process(monkeypatch):
    """A user setting (PTXGEN_VERBOSE) comes from the environment once; a kernel choice (PTXGEN_MMQ_CX) never does
    (a warning says so) and changes only in process, each change bumping the plans' generation."""
    monkeypatch.setenv("PTXGEN_VERBOSE", "1")
    monkeypatch.delenv("PTXGEN_MMQ_CX", raising=False)
    knobs.reload()
    g = knobs.generation()
    assert knobs.mmq_cx() == "auto" and knobs.verbose()
    monkeypatch.setenv("PTXGEN_VERBOSE", "0")
    assert knobs.verbose() and knobs.generation() == g  # read once: the environment is not re-read
    knobs.set(PTXGEN_MMQ_CX="1")
    assert knobs.mmq_cx() == "on" and knobs.generation() > g
    monkeypatch.setenv("PTXGEN_MMQ_CX", "0")
    knobs.reload()
    assert not knobs.verbose()
    with pytest.warns(UserWarning, match="PTXGEN_MMQ_CX is set in the environment and not read"):
        assert knobs.mmq_cx() == "auto"
    with pytest.raises(ValueError, match="no knob 'MMQ_CX'"):
        knobs.set(MMQ_CX="1")
    assert knobs.parse(["mmq_cx=0", "PTXGEN_Q4K_MMA = 1"]) == {"PTXGEN_MMQ_CX": "0", "PTXGEN_Q4K_MMA": "1"}
    with pytest.raises(ValueError, match="expected NAME=VALUE"):
        knobs.parse(["mmq_cx"])
    knobs.set(PTXGEN_MMQ_CX="sometimes")
    with pytest.raises(ValueError, match="PTXGEN_MMQ_CX"):
        knobs.mmq_cx()
    knobs.reload()


def test_bad_arguments_are_refused_when_the_plan_is_made(gpu):
    w = fakegpu.weights("q4_K", 256, 512)
    with pytest.raises(ValueError, match="mode must be"):
        ops.mul_mat_plan(w, 1, mode="quick")
    with pytest.raises(ValueError, match="rotation must be"):
        ops.mul_mat_plan(w, 1, rotation="none")
    with pytest.raises(ValueError, match="positive number of tokens"):
        ops.mul_mat_plan(w, 0)
    with pytest.raises(ValueError, match="16-byte aligned"):
        ops.mul_mat_plan(fakegpu.weights("q4_K", 64, 256, at=fakegpu.BASE + 8), 1)
    with pytest.raises(ValueError, match="q6_K weights must start 2-byte aligned"):
        ops.mul_mat_plan(fakegpu.weights("q6_K", 64, 256, at=fakegpu.BASE + 1), 1)
    with pytest.raises(ValueError, match="q5_K weights must start 8-byte aligned"):  # run8's 8-byte loads
        ops.mul_mat_plan(fakegpu.weights("q5_K", 64, 256, at=fakegpu.BASE + 4), 1)
    with pytest.raises(ValueError, match="tq4_1s weights must start 4-byte aligned"):
        ops.mul_mat_plan(fakegpu.weights("tq4_1s", 64, 256, at=fakegpu.BASE + 2), 1)


@pytest.fixture
def codec_gemvs():
    """Q5_K's few-token tensor-core builds off (RULES.codec_few_max_tokens): the routes behind them."""
    with tuning.override(codec_few_max_tokens={"q5_K": 0}):
        yield


@pytest.fixture
def frags():
    """The prepared route on fp16 fragments for every format (RULES.mmq_f16a off): the route the f16a rule replaces."""
    with tuning.override(mmq_f16a=False):
        yield


@pytest.fixture
def tq4_1s_prepared():
    """TQ4_1S's register-A GEMM off (RULES.codec_ra_mmq_min_tokens): the prepared route behind it."""
    with tuning.override(codec_ra_mmq_min_tokens=dict(ops.RULES.codec_ra_mmq_min_tokens, tq4_1s=1 << 30)):
        yield


@pytest.mark.parametrize("fmt", ["q5_K", "q6_K", "q8_0"])
def test_the_other_codecs_prefill_on_the_prepared_gemm(gpu, frags, codec_gemvs, fmt):
    """From RULES.codec_mmq_min_tokens tokens on sm_90 (M ≥ 128), where no register-A GEMM of the codec applies
    (above codec_ra_mmq_max_tokens, or with those rules off): the codec's fp16 fragments, the prepared register-A GEMM
    (converting x itself from mmq_cx_min_tokens with one K split), and the codec's fixup."""
    w = fakegpu.weights(fmt, 4096, 4096)
    f = fmt.lower()
    first = ops.RULES.codec_mmq_min_tokens[fmt]  # per format (ptxgen/tuning/h200.json)
    widest = f"gemv_{f}_f32_t{16 if fmt == 'q5_K' else 8}"  # the codec GEMV's widest shipped build
    with tuning.override(codec_ra_mmq_min_tokens=1 << 30):
        assert ops.mul_mat_plan(w, first - 1).kernels[0] == widest
        assert ops.mul_mat_plan(w, first).kernels[0] == f"dequantize_{f}_frags"
        assert ops.mul_mat_plan(w, 512).kernels == [f"dequantize_{f}_frags", "convert_f16_perm",
                                                    "mmq_q4_k_wgmma_pre_n256", f"mul_mat_fixup_{f}"]
        assert ops.mul_mat_plan(w, 4096).kernels == [f"dequantize_{f}_frags", "mmq_q4_k_wgmma_pre_n256_cx",
                                                     f"mul_mat_fixup_{f}"]
        assert ops.mul_mat_plan(w, 512, arch="sm_89").kernels[1] == f"mmq_{f}_f16_n128_x16"  # mma.sync's GEMM there
        assert ops.mul_mat_plan(fakegpu.weights(fmt, 64, 4096), 512).kernels[0] == widest  # M < 128
    if fmt != "q8_0":  # Q8_0's register-A GEMM runs at every T
        above = ops.RULES.codec_ra_mmq_max_tokens[fmt] + 1
        assert ops.mul_mat_plan(w, above).kernels[0] == f"dequantize_{f}_frags"


def test_q5_k_takes_the_few_token_tensor_core_builds_up_to_its_rule(gpu):
    """RULES.codec_few_max_tokens (Q5_K: 32 on the H200): up to it, exact Q5_K calls run gemv_q5_k_mma_t{1,2,4,8}
    on prep_q4k_t*'s records — 1-4 tokens called eagerly in one launch (gemv_q5_k_mma_t*_fused), as Q4_K's —, 9-16
    tokens gemv_q5_k_mma_t16h, 17-32 the skinny GEMM mmq_q5_k_rega_n32; above it, or with weights not 16-byte
    aligned, the routes after it (the codec GEMV, the register-A GEMM)."""
    w = fakegpu.weights("q5_K", 4096, 14336)
    assert ops.mul_mat_plan(w, 1).kernels == ["gemv_q5_k_i8_t1_fused"]  # shipped (the int8 build at 1-4 tokens)
    with tuning.override(codec_few_max_tokens={"q5_K": 0}):  # off: the codec GEMV
        assert ops.mul_mat_plan(w, 1).kernels == ["gemv_q5_k_f32_t1"]
    tuning.set(few_i8_max_tokens={"q5_K": 0})  # (the fp16 builds below; the fixture resets the rules)
    with tuning.override(codec_few_max_tokens={"q5_K": 16}):
        for t, nt in ((1, "t1"), (2, "t2"), (3, "t4"), (5, "t8"), (8, "t8"), (9, "t16h"), (16, "t16h")):
            want = [f"prep_q4k_{nt}", f"gemv_q5_k_mma_{nt}"]
            assert ops.mul_mat_plan(w, t, graph=True).kernels == want
            assert ops.mul_mat_plan(w, t).kernels == ([f"gemv_q5_k_mma_{nt}_fused"] if t <= 4 else want)
        assert ops.mul_mat_plan(w, 17).kernels[1] == "mmq_q5_k_wgmma_ra_n64"
        assert ops.mul_mat_plan(w, 4, arch="sm_89", graph=True).kernels == ["prep_q4k_t4", "gemv_q5_k_mma_t4"]
    with tuning.override(codec_few_max_tokens={"q5_K": 32}):  # 17-32 tokens: the skinny GEMM, one prep per 32
        assert ops.mul_mat_plan(w, 17).kernels == ["prep_q4k_t32h", "mmq_q5_k_rega_n32"]
        assert ops.mul_mat_plan(w, 32).kernels == ["prep_q4k_t32h", "mmq_q5_k_rega_n32"]
        assert ops.mul_mat_plan(w, 33).kernels[1] == "mmq_q5_k_wgmma_ra_n64"
        assert ops.mul_mat_plan(fakegpu.weights("q5_K", 4096, 14336, at=fakegpu.BASE + 8), 1).kernels == \
            ["gemv_q5_k_f32_t1"]
    with tuning.override(codec_few_max_tokens={"q5_K": 8}):
        assert ops.mul_mat_plan(w, 9).kernels[1] == "mmq_q5_k_wgmma_ra_n64"


@pytest.mark.parametrize("fmt", ["q6_K", "q8_0"])
def test_the_mma_block_codecs_take_the_few_token_builds_where_their_rule_allows(gpu, fmt):
    """Q6_K and Q8_0 on the few-token builds (gemv_<fmt>_mma_t{1,2,4,8}, on prep_sub16_t*'s records): off where
    RULES.codec_few_max_tokens leaves the format at 0 (the route before them runs); with it, up to 8 tokens, 1-4
    called eagerly in one launch (gemv_<fmt>_mma_t*_fused), as Q4_K's (shipped at 16: 9-16 on fp16 activations).
    Q6_K's 210-byte steps ask rows a multiple of 4 bytes (K a multiple of 512) and M rows a multiple of 16 bytes;
    weights not 16-byte aligned keep the route after."""
    tuning.set(few_i8_max_tokens={"q4_K": 2})  # (the fp16 builds: the other formats' int8 ones off)
    f = fmt.lower()
    w = fakegpu.weights(fmt, 4096, 14336)
    with tuning.override(codec_few_max_tokens={fmt: 0}):
        for graph in (False, True):
            before = ops.mul_mat_plan(w, 1, graph=graph).kernels
            assert not any(re.fullmatch(rf"prep_sub16_t\d+h?(_x16)?|gemv_{f}_mma_t\d+h?(_fused)?", k)
                           for k in before), before
    with tuning.override(codec_few_max_tokens={fmt: 8}):
        for t, nt in ((1, "t1"), (2, "t2"), (3, "t4"), (5, "t8"), (8, "t8")):
            want = [f"prep_sub16_{nt}", f"gemv_{f}_mma_{nt}"]
            assert ops.mul_mat_plan(w, t, graph=True).kernels == want
            assert ops.mul_mat_plan(w, t).kernels == ([f"gemv_{f}_mma_{nt}_fused"] if t <= 4 else want)
        assert ops.mul_mat_plan(w, 9).kernels != ops.mul_mat_plan(w, 8).kernels  # past the builds: the route after
        assert ops.mul_mat_plan(w, 2, arch="sm_89", graph=True).kernels == ["prep_sub16_t2", f"gemv_{f}_mma_t2"]
        t8 = ops.mul_mat_plan(w, 5, arch="sm_89", graph=True).kernels  # Q8_0's 8-token ring does not fit there
        assert (t8[0] == "prep_sub16_t8") == (fmt == "q6_K"), t8
        assert ops.mul_mat_plan(fakegpu.weights(fmt, 4096, 14336, at=fakegpu.BASE + 8), 1, graph=True).kernels[0] != \
            "prep_sub16_t1"
        if fmt == "q6_K":  # K/256 odd: rows at alternating 2-byte phases; M·row not a multiple of 16
            plan = lambda m, k: ops.mul_mat_plan(fakegpu.weights(fmt, m, k), 1, graph=True).kernels[0]  # noqa: E731
            assert plan(4096, 14080) != "prep_sub16_t1"
            assert plan(4098, 4608) != "prep_sub16_t1" and plan(4100, 4608) == "prep_sub16_t1"  # rows of 3780 bytes


@pytest.mark.parametrize("fmt", ["q6_K", "q8_0"])
def test_the_mma_block_codecs_take_the_sixteen_token_build_under_their_rule(gpu, fmt):
    """9-16 tokens of Q6_K / Q8_0: gemv_<fmt>_mma_t16h on prep_sub16_t16h's records (fp16 activations, as Q4_K's and
    Q5_K's t16h) where RULES.codec_few_max_tokens[fmt] reaches the call's tokens — shipped at 16 (H100, 2026-12-06:
    faster than the register-A GEMM at T = 9 and 16 on every shape timed); eager and graph alike (no one-launch
    build), fp16 x into the prep's _x16 twin; 17 tokens, and Q8_0 on sm_89 (its ring does not fit there), keep the
    routes after; at 8 the rule leaves 9-16 tokens to the GEMM."""
    f = fmt.lower()
    w = fakegpu.weights(fmt, 4096, 14336)
    with tuning.override(codec_few_max_tokens={fmt: 8}):
        assert f"gemv_{f}_mma_t16h" not in ops.mul_mat_plan(w, 16).kernels
        assert f"gemv_{f}_mma_t16h" not in ops.mul_mat_plan(w, 9, graph=True).kernels
    want = ["prep_sub16_t16h", f"gemv_{f}_mma_t16h"]
    for t in (9, 12, 16):
        assert ops.mul_mat_plan(w, t).kernels == want
        assert ops.mul_mat_plan(w, t, graph=True).kernels == want
    assert ops.mul_mat_plan(w, 16, graph=True, x_dtype="float16").kernels == ["prep_sub16_t16h_x16", want[1]]
    assert want[1] not in ops.mul_mat_plan(w, 17).kernels
    assert (ops.mul_mat_plan(w, 16, arch="sm_89").kernels == ["prep_sub16_t16h", want[1]]) == (fmt == "q6_K")


def test_stream_k_runs_where_the_tiles_fill_the_rounds_unevenly(gpu):
    """The register-A GEMM's stream-K builds (mmq_<fmt>_wgmma_ra_n{128,256}_sk): off as shipped
    (mmq_stream_k_min_gain 0: not timed); with the rule, where the cost model says so: 14336x4096 at T = 512 (224
    n256 tiles on 132 CTAs) takes 132 CTAs of L = ceil(224·64 / 132) = 109 K-steps, two partial planes a CTA, a
    counter a tile; 4096x4096 (64 tiles split in two) and the converting build's large T keep their plans; the
    forced path ("wgmma_ra_sk") runs it whatever the rule."""
    w = fakegpu.weights("q4_K", 14336, 4096)
    assert not any(k.endswith("_sk") for k in ops.mul_mat_plan(w, 512).kernels)  # shipped: off
    with tuning.override(mmq_stream_k_min_gain=0.05):
        plan = ops.mul_mat_plan(w, 512)
        assert plan.kernels == ["convert_f16", "mmq_q4_k_wgmma_ra_n256_sk", "mul_mat_fixup_q4_k"]
        ln = plan.launches[1]
        assert ln.grid == (132,) and ln.args[3:7] == (14336, 4096, 512, 109) and ln.args[8:10] == (2, 0)
        assert plan.scratch_bytes >= 2 * 132 * 128 * 256 * 4 and plan.counter_bytes >= 4 * 224
        assert ops.mul_mat_plan(fakegpu.weights("q4_K", 4096, 4096), 512).kernels[1].removesuffix("_cs") == \
            "mmq_q4_k_wgmma_ra_n256"
        assert ops.mul_mat_plan(w, 4096).kernels[0] == "mmq_q4_k_wgmma_ra_n256_cx"
        assert ops.mul_mat_plan(fakegpu.weights("q4_K", 9000, 4096), 128).kernels[1] == "mmq_q4_k_wgmma_ra_n128_sk"
        assert ops.mul_mat_plan(fakegpu.weights("q8_0", 9000, 3584), 512).kernels[1] == "mmq_q8_0_wgmma_ra_n256_sk"


def test_shared_record_builds_run_where_their_rule_allows(gpu):
    """The few-token builds whose records a CTA's warps share (gemv_<fmt>_mma_t{4,8}s): off as shipped
    (few_shared_min_tokens 0: not timed); with the rule, from its T, prep_q4k_t* then the shared build over (row
    CTAs, K splits, 1) in graphs and eager calls alike (the one-launch fused builds keep 1-4 tokens eagerly)."""
    tuning.set(few_i8_max_tokens={"q4_K": 2})  # (the fp16 builds: the other formats' int8 ones off)
    w = fakegpu.weights("q4_K", 4096, 14336)
    assert not any(k.endswith("s") and "_mma_t" in k for t in range(1, 9) for k in ops.mul_mat_plan(w, t).kernels)
    with tuning.override(few_shared_min_tokens={"q4_K": 5, "q5_K": 3}):
        for t in (5, 8):
            plan = ops.mul_mat_plan(w, t, graph=True)
            assert plan.kernels == ["prep_q4k_t8", "gemv_q4_k_mma_t8s"] == ops.mul_mat_plan(w, t).kernels
            assert plan.launches[1].grid == (32, 8, 1)  # 128 rows a CTA; 8 splits of 7 super-blocks fill 264 slots
        assert ops.mul_mat_plan(w, 4, graph=True).kernels == ["prep_q4k_t4", "gemv_q4_k_mma_t4"]  # below the rule
        w5 = fakegpu.weights("q5_K", 4096, 14336)
        assert ops.mul_mat_plan(w5, 3, graph=True).kernels == ["prep_q4k_t4", "gemv_q5_k_mma_t4s"]
        assert ops.mul_mat_plan(w5, 3).kernels == ["gemv_q5_k_mma_t4_fused"]


def test_int8_few_token_builds_run_where_their_rule_allows(gpu):
    """The int8 few-token GEMVs (prep_q{4,6}k_i8_t* + gemv_<fmt>_i8_t*): as shipped, Q4_K's at 1-2 tokens, Q5_K's at
    1-4, Q6_K's and Q8_0's at 1-8 (few_i8_max_tokens); with the rule, up to its T, prep + GEMV in graphs, the one-launch
    build in eager calls of 1-4 tokens (as the fp16 builds); a format the rule leaves at 0 keeps its fp16 builds."""
    w = fakegpu.weights("q4_K", 4096, 14336)
    assert [ops.mul_mat_plan(w, t, graph=True).kernels[-1] for t in range(1, 5)] == [
        "gemv_q4_k_i8_t1", "gemv_q4_k_i8_t2", "gemv_q4_k_mma_t4", "gemv_q4_k_mma_t4"]
    w5, w6 = fakegpu.weights("q5_K", 4096, 14336), fakegpu.weights("q6_K", 4096, 14336)
    with tuning.override(codec_few_max_tokens={"q5_K": 32, "q6_K": 8}):
        assert [ops.mul_mat_plan(w5, t, graph=True).kernels[-1] for t in (1, 2, 3, 4, 5)] == [
            "gemv_q5_k_i8_t1", "gemv_q5_k_i8_t2", "gemv_q5_k_i8_t4", "gemv_q5_k_i8_t4", "gemv_q5_k_mma_t8"]
        # Q6_K's on its own records (prep_q6k_i8: the sub-block digit sums)
        assert ops.mul_mat_plan(w6, 2, graph=True).kernels == ["prep_q6k_i8_t2", "gemv_q6_k_i8_t2"]
        assert ops.mul_mat_plan(w6, 3).kernels == ["gemv_q6_k_i8_t4_fused"]
        assert ops.mul_mat_plan(w6, 8).kernels == ["prep_q6k_i8_t8", "gemv_q6_k_i8_t8"]
    with tuning.override(few_i8_max_tokens={"q4_K": 4}, codec_few_max_tokens={"q5_K": 32}):
        for t in range(1, 9):
            nt = next(v for v in (1, 2, 4, 8) if v >= t)
            for graph in (True, False):
                plan = ops.mul_mat_plan(w, t, graph=graph)
                if t <= 4:
                    want = [f"prep_q4k_i8_t{nt}", f"gemv_q4_k_i8_t{nt}"] if graph else [f"gemv_q4_k_i8_t{nt}_fused"]
                    assert plan.kernels == want, (t, plan.kernels)
                else:
                    assert not any("i8" in k for k in plan.kernels), (t, plan.kernels)
        assert not any("i8" in k for k in ops.mul_mat_plan(w5, 2, graph=True).kernels)  # (not listed: 0)
        assert not any("i8" in k for k in ops.mul_mat_plan(w6, 1, graph=True).kernels)
    # Q8_0's on Q6_K's records (the digit planes in the natural order): shipped at 1-8 tokens (H100, 2026-12-06); off
    # (0), the fp16 builds
    w8 = fakegpu.weights("q8_0", 4096, 14336)
    with tuning.override(few_i8_max_tokens={"q8_0": 0}):
        assert not any("i8" in k for k in ops.mul_mat_plan(w8, 1, graph=True).kernels)
    assert ops.mul_mat_plan(w8, 1, graph=True).kernels == ["prep_q6k_i8_t1", "gemv_q8_0_i8_t1"]
    assert ops.mul_mat_plan(w8, 2).kernels == ["gemv_q8_0_i8_t2_fused"]
    assert ops.mul_mat_plan(w8, 2, x_dtype="float16").kernels == ["gemv_q8_0_i8_t2_fused_x16"]
    assert ops.mul_mat_plan(w8, 6).kernels == ["prep_q6k_i8_t8", "gemv_q8_0_i8_t8"]


def test_fp16_activations_skip_the_conversion_and_the_fixup_where_the_gemm_reads_fp16(gpu, frags):
    """mul_mat_plan(x_dtype="float16"): the register-A / prepared wgmma GEMMs take an fp16 x permuted (permute_f16)
    or, where the build reads x in its natural K order (mmq.RA_NATURAL_FORMATS: all but TQ4_1S), as it is (no
    launch before the GEMM), never a converting build, and record no fixup (nothing can leave fp16); a rotated codec
    (TQ4_1S) runs the float32 plan's kernels, its rotation reading x as it is (rotate_tq4_1s_f16); the fp16 mma.sync GEMM where
    it copies x by cp.async (sm_89's; sm_120a's codec builds), which reads it as it is, and the plain wgmma one and
    sm_120a's Q4_K, which take it by TMA (a tensor map over the caller's x, no fixup);
    each dtype has its own cached plan and the float32 ones are unchanged."""
    for fmt, m, k in (("q4_K", 4096, 14336), ("q6_K", 4096, 14336), ("q8_0", 4096, 4096), ("q5_K", 1024, 4096)):
        w = fakegpu.weights(fmt, m, k)
        for t in (40, 512, 4096):
            f32 = ops.mul_mat_plan(w, t, graph=True).kernels
            f16 = ops.mul_mat_plan(w, t, graph=True, x_dtype="float16").kernels
            gemm = next(n for n in f16 if n.startswith("mmq_"))
            natural = kernels.entry(gemm, "sm_90a")["meta"].get("x_order") == "natural"
            assert f32[-1].startswith("mul_mat_fixup") and ("permute_f16" in f16) != natural and not any(
                n.startswith(("mul_mat_fixup", "convert_f16", "convert_f32")) or n.endswith("_cx") for n in f16), (
                fmt, t, f32, f16)
            assert [n for n in f16 if n != "permute_f16"] == [n.replace("_cx", "") for n in f32
                                                              if not n.startswith(("mul_mat_fixup", "convert_f16"))]
            assert ops.mul_mat_plan(w, t, graph=True).kernels == f32  # (cached apart)
        for t in (1, 3, 8):  # the decode routes: their preps' / one-token codec GEMVs' _x16 builds, else widened once
            f32, f16 = ops.mul_mat_plan(w, t).kernels, ops.mul_mat_plan(w, t, x_dtype="float16").kernels
            assert f16 == ["convert_f32"] + f32 or [n.removesuffix("_x16") for n in f16] == f32, (t, f16)
        for arch in ("sm_89", "sm_120a"):  # the fp16 mma.sync GEMM reads it as it is where it copies x by cp.async
            f32 = ops.mul_mat_plan(w, 512, arch=arch).kernels
            f16 = ops.mul_mat_plan(w, 512, arch=arch, x_dtype="float16").kernels
            direct = [n for n in f32 if not n.startswith(("convert_f16", "mul_mat_fixup"))]
            assert f16 == direct, (arch, f32, f16)  # (sm_120a's Q4_K: x by TMA, a map over the call's x)
    w = fakegpu.weights("q4_K", 1024, 4096)  # the plain wgmma GEMM (small weights, 17-32 tokens): x as it is (its
    # natural K order, by a tensor map over the caller's x), no fixup
    for t in (17, 32):
        f32 = ops.mul_mat_plan(w, t, graph=True).kernels
        assert f32[0] == "convert_f16" and f32[1].startswith("mmq_q4_k_wgmma_n"), f32
        assert ops.mul_mat_plan(w, t, graph=True, x_dtype="float16").kernels == [f32[1]]
    w = fakegpu.weights("q4_K", 14336, 4096)  # where fp32 converts inside the GEMM, fp16 takes its _x16 build (the
    # same arithmetic), not stream-K's split sums, whatever mmq_stream_k_min_gain says
    with tuning.override(mmq_stream_k_min_gain=0.05):
        for t in (1024, 3000):
            assert ops.mul_mat_plan(w, t).kernels[0] == "mmq_q4_k_wgmma_ra_n256_cx"
            assert ops.mul_mat_plan(w, t, x_dtype="float16").kernels == ["mmq_q4_k_wgmma_ra_n256"]
    w = fakegpu.weights("tq4_1s", 18944, 3584)  # the rotation reads either dtype (rotate_tq4_1s_f16's ROT_X16)
    f32, f16 = ops.mul_mat_plan(w, 512), ops.mul_mat_plan(w, 512, x_dtype="float16")
    assert f16.kernels == f32.kernels and f32.kernels[0] == "rotate_tq4_1s_f16"
    assert f16.launches[0].args[-1] == f32.launches[0].args[-1] | ROT_X16
    for bad in ("float64", "bfloat16"):
        with pytest.raises(TypeError, match=f"expected dtype float32 or float16, got {bad}"):
            ops.mul_mat_plan(w, 512, x_dtype=bad)


def test_fp16_activations_go_to_the_few_token_preps_x16_builds(gpu):
    """An fp16 x in the decode routes: where the plan runs a few-token prep (graph plans at 1-8 tokens, eager ones
    where the format has no one-launch build: T = 5-8; the hi-only preps of 9-32 tokens), it is the prep's _x16
    build on x as given — no convert_f32 launch, the float32 plan's kernels otherwise; so is a one-token codec GEMV
    (small weights), and so are the lane and tensor-core GEMVs' preps (TQ4_1S's, Q4_K's tensor-core GEMV, the int8
    lanes'), the one-launch builds of eager calls (their _fused_x16 twins) and the codec GEMVs of several tokens."""
    cases = (("q4_K", 4096, 14336), ("q5_K", 4096, 14336), ("q6_K", 14336, 4096), ("q8_0", 4096, 14336))
    for fmt, m, k in cases:
        w = fakegpu.weights(fmt, m, k)
        for t in range(1, 9):
            f32 = ops.mul_mat_plan(w, t, graph=True).kernels
            f16 = ops.mul_mat_plan(w, t, graph=True, x_dtype="float16").kernels
            assert f32[0].startswith("prep_") and f16 == [f32[0] + "_x16"] + f32[1:], (fmt, t, f32, f16)
            eager, eager32 = ops.mul_mat_plan(w, t, x_dtype="float16").kernels, ops.mul_mat_plan(w, t).kernels
            if eager32[-1].endswith("_fused"):  # the one-launch build's fp16-x twin: still one launch
                assert eager == [eager32[-1] + "_x16"] and len(eager32) == 1, (fmt, t, eager)
            else:
                assert eager == f16, (fmt, t, eager)
        for t in (9, 16, 17, 32):  # the hi-only preps (t16h GEMV, skinny GEMM) likewise; the others' GEMMs
            f32 = ops.mul_mat_plan(w, t, graph=True).kernels
            f16 = ops.mul_mat_plan(w, t, graph=True, x_dtype="float16").kernels
            if f32[0].startswith("prep_"):
                assert f16 == [f32[0] + "_x16"] + f32[1:], (fmt, t, f32, f16)
            else:
                assert f16[0] == "permute_f16" or fmt in mmq.RA_NATURAL_FORMATS and f16[0].startswith("mmq_"), (
                    fmt, t, f16)
    for fmt in ("q4_K", "q6_K", "q8_0"):  # small: the codec GEMV at one token, its _x16 build
        w = fakegpu.weights(fmt, 1024, 4096)
        assert ops.mul_mat_plan(w, 1, graph=True, x_dtype="float16").kernels == [f"gemv_{fmt.lower()}_f32_t1_x16"]
    w = fakegpu.weights("q5_K", 1024, 2048)  # (a codec GEMV slice of several tokens: its _x16 twin too)
    with tuning.override(codec_few_max_tokens={"q5_K": 0}, few_i8_max_tokens={"q5_K": 0}):
        assert ops.mul_mat_plan(w, 3, graph=True, x_dtype="float16").kernels == ["gemv_q5_k_f32_t4_x16"]
    w = fakegpu.weights("tq4_1s", 4096, 14336)  # the rotated codec's lane and tensor-core preps: their _x16 twins
    for t in (1, 4, 9, 16):
        f32 = ops.mul_mat_plan(w, t, graph=True).kernels
        f16 = ops.mul_mat_plan(w, t, graph=True, x_dtype="float16").kernels
        assert f16 == [n + "_x16" if n.startswith("prep_") else n for n in f32], (t, f32, f16)
    for fmt, m, t, mode in (("q4_K", 128256, 5, "exact"), ("q8_0", 1024, 2, "fast"), ("q4_K", 1024, 1, "fast")):
        w = fakegpu.weights(fmt, m, 4096)  # Q4_K's tensor-core GEMV prep, the int8 lanes' Q8_1 prep
        f32 = ops.mul_mat_plan(w, t, graph=True, mode=mode).kernels
        f16 = ops.mul_mat_plan(w, t, graph=True, mode=mode, x_dtype="float16").kernels
        assert f32[0] in ("prep_mma_f16", "prep_q8_lanes") and f16 == [f32[0] + "_x16"] + f32[1:], (fmt, f32, f16)
    with tuning.override(few_i8_max_tokens={"q4_K": 0, "q5_K": 0, "q6_K": 0}):  # the fp16 builds' preps too
        w = fakegpu.weights("q6_K", 4096, 14336)
        assert ops.mul_mat_plan(w, 2, graph=True, x_dtype="float16").kernels == ["prep_sub16_t2_x16", "gemv_q6_k_mma_t2"]


def test_codec_few_min_tokens_leaves_fewer_tokens_to_the_other_decode_kernels(gpu):
    """codec_few_min_tokens: below it a format's calls keep the routes they had (TQ4_1S's lane and tensor-core
    GEMVs), from it the few-token builds take them — with few_shared_min_tokens, the shared-record ones."""
    w = fakegpu.weights("tq4_1s", 18944, 3584)
    before = {t: ops.mul_mat_plan(w, t, graph=True).kernels for t in range(1, 9)}
    with tuning.override(codec_few_max_tokens={"tq4_1s": 8}, codec_few_min_tokens={"tq4_1s": 4},
                         few_shared_min_tokens={"tq4_1s": 4}):
        for t in range(1, 9):
            plan = ops.mul_mat_plan(w, t, graph=True).kernels
            if t < 4:
                assert plan == before[t]
            else:
                assert plan[-1] == ("gemv_tq4_1s_mma_t4s" if t == 4 else "gemv_tq4_1s_mma_t8s"), plan


def test_tq4_1s_takes_the_few_token_builds_where_its_rule_allows(gpu):
    """TQ4_1S on the few-token builds (gemv_tq4_1s_mma_t{1,2,4,8} on prep_rot16_t*'s records of the rotated x): off
    as shipped (codec_few_max_tokens 0: not timed); with the rule, up to its T, prep + GEMV eager and captured (no
    one-launch build), the 4-token build for 3 tokens; not with rotation="fused" up to FUSED_MAX_TOKENS (the caller
    asked for the rotation inside the GEMV), nor for weights off 16 bytes; the sm_89 builds to 4 tokens (the
    8-token ring does not fit there beside the codebook table)."""
    w = fakegpu.weights("tq4_1s", 18944, 3584)
    assert not any(k.startswith(("prep_rot16", "gemv_tq4_1s_mma_t")) for t in range(1, 9)
                   for k in ops.mul_mat_plan(w, t).kernels)  # shipped: off
    with tuning.override(codec_few_max_tokens={"tq4_1s": 8}):
        for t, nt in ((1, "t1"), (2, "t2"), (3, "t4"), (4, "t4"), (5, "t8"), (8, "t8")):
            want = [f"prep_rot16_{nt}", f"gemv_tq4_1s_mma_{nt}"]
            assert ops.mul_mat_plan(w, t).kernels == ops.mul_mat_plan(w, t, graph=True).kernels == want
        assert ops.mul_mat_plan(w, 9).kernels[:2] != ["prep_rot16_t8", "gemv_tq4_1s_mma_t8"]  # past the builds
        assert ops.mul_mat_plan(w, 1, rotation="fused").kernels == ["gemv_tq4_1s_t1_fused"]
        assert ops.mul_mat_plan(w, 8, rotation="fused").kernels == ["prep_rot16_t8", "gemv_tq4_1s_mma_t8"]
        assert ops.mul_mat_plan(w, 4, arch="sm_89").kernels == ["prep_rot16_t4", "gemv_tq4_1s_mma_t4"]
        assert "gemv_tq4_1s_mma_t8" not in ops.mul_mat_plan(w, 8, arch="sm_89").kernels
        assert ops.mul_mat_plan(fakegpu.weights("tq4_1s", 18944, 3584, at=fakegpu.BASE + 4), 1).kernels[0] != \
            "prep_rot16_t1"


def test_builds_that_count_the_records_ready_get_the_zero_kept_word_both(gpu, monkeypatch):
    """A few-token prep + GEMV pair built with gemv_t1.T1_FLAG (meta ready_flag; a probe's builds, swapped in for the
    emitted ones): the plan passes both the same zero-kept `ready` words, last; a pair where only one counts is a
    clear error, not a GEMV that waits forever or reads records early."""
    from ptxgen.runtime import kernels

    real = kernels.entry
    flagged = {"prep_q4k_t1", "gemv_q4_k_mma_t1"}

    def entry(name, arch):
        e = real(name, arch)
        return dict(e, meta=dict(e["meta"], ready_flag="(test)")) if name in flagged else e
    monkeypatch.setattr(kernels, "entry", entry)
    w = fakegpu.weights("q4_K", 4096, 14336)
    with tuning.override(few_i8_max_tokens={"q4_K": 0}):  # (the fp16 builds: the int8 ones have no T1_FLAG build)
        prep, gemv = ops.mul_mat_plan(w, 1, graph=True).launches
        assert [(a.base, a.off) for a in (prep.args[-1], gemv.args[-1])] == [("ready", 0)] * 2 and len(prep.args) == 5
        flagged.discard("prep_q4k_t1")
        with pytest.raises(RuntimeError, match="one counts the records ready"):
            ops.mul_mat_plan(fakegpu.weights("q4_K", 4096, 14336), 1, graph=True)


@pytest.mark.parametrize("fmt,box,gemv", [("q8_0", 80, "gemv_q8_0_f32_t8"), ("q5_K", 16, "gemv_q5_k_f32_t16")])
def test_codec_register_a_gemm_runs_from_its_rule_ahead_of_the_prepared_route(gpu, frags, codec_gemvs, monkeypatch, fmt, box,
                                                                               gemv):
    """A codec's register-A GEMM (its blocks decoded in the K loop, no fragment pass) for T within
    RULES.codec_ra_mmq_{min,max}_tokens on sm_90: convert_f16_perm (convert_f16 where the build reads x in its natural
    K order: Q5_K), mmq_<fmt>_wgmma_ra_n<tile>, the fixup (from
    mmq_cx_min_tokens with one K split the build converting x itself, mmq_<fmt>_wgmma_ra_n<tile>_cx, alone); its
    weights by a tensor map of the raw rows (Q8_0: 80-byte boxes a step, n64's 68-word boxes a block; Q5_K: 16-byte
    columns). Below, the codec GEMV
    (exact); above, the prepared route. Weights not 16-byte aligned keep the prepared route; off sm_90, the GEMV."""
    from ptxgen import formats
    from ptxgen.runtime import tma

    maps, encode = [], tma.tensor_map_2d
    monkeypatch.setattr(tma, "tensor_map_2d", lambda *a, **kw: maps.append(a) or encode(*a, **kw))
    monkeypatch.setattr(ops, "_TMAPS", {})
    f = fmt.lower()
    w = fakegpu.weights(fmt, 4096, 4096)
    lo, hi = ops.RULES.codec_ra_mmq_min_tokens[fmt], ops.RULES.codec_ra_mmq_max_tokens[fmt]
    assert lo == ops.RULES.mmq_min_tokens  # the decode GEMVs' 8 tokens stay exact
    p = ops.mul_mat_plan(w, 512)
    conv = "convert_f16" if fmt in mmq.RA_NATURAL_FORMATS else "convert_f16_perm"
    assert p.kernels == [conv, f"mmq_{f}_wgmma_ra_n256", f"mul_mat_fixup_{f}"]
    assert ops.mul_mat_plan(w, 64).kernels[1] == f"mmq_{f}_wgmma_ra_n64"
    assert ops.mul_mat_plan(w, lo).kernels[1] == f"mmq_{f}_wgmma_ra_n64"
    with tuning.override(codec_mma_max_tokens=0):  # below the rule: the codec GEMV (Q8_0's tensor-core one aside)
        assert ops.mul_mat_plan(w, lo - 1).kernels[0] == gemv.replace("t16", "t8")
    # from mmq_cx_min_tokens with one K split: the build converting x itself (no convert_f16_perm)
    assert ops.mul_mat_plan(w, min(hi, 1 << 14)).kernels[0] == f"mmq_{f}_wgmma_ra_n256_cx"
    with tuning.override(mmq_cx_min_tokens=1 << 30):
        assert ops.mul_mat_plan(w, min(hi, 1 << 14)).kernels[1] == f"mmq_{f}_wgmma_ra_n256"
    if hi < 1 << 14:
        assert ops.mul_mat_plan(w, hi + 1).kernels[0] == f"dequantize_{f}_frags"
    assert (w.ptr, "u8", 4096, formats.get(fmt).row_bytes(4096), 128, box, "none") in maps  # the raw rows
    if fmt == "q8_0":  # n64: a box a block, 68 u32 words (codecs/q8_0.py RA_BLOCK_BOX_MAX_BN)
        assert (w.ptr, "u32", 4096, formats.get(fmt).row_bytes(4096) // 4, 128, 68, "none") in maps
    assert ops.mul_mat_plan(fakegpu.weights(fmt, 4096, 4096, at=fakegpu.BASE + 8), 512).kernels[0] == \
        f"dequantize_{f}_frags"
    assert ops.mul_mat_plan(w, 512, arch="sm_89").kernels[1] == f"mmq_{f}_f16_n128_x16"  # mma.sync's GEMM there
    with tuning.override(codec_ra_mmq_min_tokens=1 << 30):
        assert ops.mul_mat_plan(w, 512).kernels[0] == f"dequantize_{f}_frags"


def test_tq4_1s_prefill_rotates_once_then_runs_the_prepared_gemm(gpu, tq4_1s_prepared):
    """TQ4_1S from codec_mmq_min_tokens on sm_90: rotate_tq4_1s_f16 rotates x once into fp32 scratch (the fixup's x)
    and, in the same launch, into the fp16 copy in the register-A K order the prepared GEMM (on the rotated-domain
    fragments) reads (no convert_f16_perm); below that, its decode GEMVs."""
    w = fakegpu.weights("tq4_1s", 18944, 3584)
    p = ops.mul_mat_plan(w, 512)
    assert p.kernels == ["rotate_tq4_1s_f16", "dequantize_tq4_1s_frags", "mmq_q4_k_wgmma_pre_n256",
                         "mul_mat_fixup_tq4_1s"]
    x, rot, rot16, flag, _, mode = p.launches[0].args
    assert x != rot and mode == ROT_REGA and flag == p.launches[3].args[0]  # the flag the fixup reads
    assert p.launches[3].args[3] == rot and p.launches[2].args[1].ptr == rot16.ptr  # the fixup's x, the GEMM's map
    # where fp32 x would be converted inside the GEMM (_cx), the copy the rotation wrote is read instead
    assert ops.mul_mat_plan(w, 4096).kernels[2] == "mmq_q4_k_wgmma_pre_n256"
    with knobs.override(PTXGEN_ROTATE_F16="0"):
        assert ops.mul_mat_plan(w, 4096).kernels[2] == "mmq_q4_k_wgmma_pre_n256_cx"
    first = ops.RULES.codec_mmq_min_tokens["tq4_1s"]
    assert ops.mul_mat_plan(w, 16).kernels[0] == ops.mul_mat_plan(w, first - 1).kernels[0] == "prep_tq4_1s_mma"
    assert ops.mul_mat_plan(w, first).kernels[0] == "rotate_tq4_1s_f16"
    with tuning.override(codec_mmq_min_tokens=17):  # one number for every format
        assert ops.mul_mat_plan(w, 17).kernels[0] == "rotate_tq4_1s_f16"


@pytest.mark.parametrize("fmt", ["q5_K", "q6_K", "q8_0"])
def test_the_other_codecs_run_the_codec_gemv_in_slices_of_8(gpu, codec_gemvs, fmt):
    """Q5_K, Q6_K (and Q8_0 in mode "exact") below the GEMMs' T run gemv_<fmt>_f32_t<nt>:
    one launch per slice of up to 8 tokens, the slice's token count rounded up to 1, 2, 4 or 8 — Q5_K, which ships
    its 16-token build, slices of up to 16 (9-16 tokens: that build)."""
    w = fakegpu.weights(fmt, 300, 512)
    assert ops.mul_mat_plan(w, 1).kernels == [f"gemv_{fmt.lower()}_f32_t1"]
    with tuning.override(codec_mmq_min_tokens=1 << 30, codec_ra_mmq_min_tokens=1 << 30, codec_mma_max_tokens=0):
        p = ops.mul_mat_plan(w, 11 if fmt != "q5_K" else 19)
    builds, counts = ((8, 4), [8, 3]) if fmt != "q5_K" else ((16, 4), [16, 3])
    assert p.kernels == [f"gemv_{fmt.lower()}_f32_t{nt}" for nt in builds]
    rows = [gemv_codec.WARPS * gemv_codec.tuned_shape(fmt, nt)[0] for nt in builds]  # rows per warp as tuned
    assert [ln.fn.meta["rows_per_cta"] for ln in p.launches] == rows
    assert [ln.grid for ln in p.launches] == [(-(-300 // r),) for r in rows] and [ln.args[-1] for ln in p.launches] == counts
    with tuning.override(mmq_min_tokens=1 << 30):  # the GEMMs ruled out on sm_89 too: slices all the way
        assert len(ops.mul_mat_plan(w, 512, arch="sm_89").launches) == (32 if fmt == "q5_K" else 64)
    assert all(ln.fn.meta.get("pdl_head") for ln in p.launches)


# --- binding and running ------------------------------------------------------------------------------------

def test_a_bound_plan_patches_only_x_and_y_per_call(gpu, monkeypatch):
    """Binding resolves scratch and state against the workspace once; a call writes x and y (plus their slice
    offsets) into the packed cells and issues the launches in order on its stream."""
    w = fakegpu.weights("q4_K", 4096, 14336)
    p = ops.mul_mat_plan(w, 16)  # prep_q4k_t16h(x, rec, n, k), gemv_q4_k_mma_t16h(w, rec, y, ...)
    ws = fakegpu.FakeWorkspace(p)
    b = p.bound(ws)
    assert p.bound(ws) is b
    issued = []
    monkeypatch.setattr(driver.PreparedLaunch, "run", lambda self, stream: issued.append(
        (self.fn.name, stream, [c.value if not isinstance(c, ctypes.Array) else None for c in self.cells])))
    b.run(0x1000, 0x2000, 77)
    b.run(0x3000, 0x4000, 78)
    (prep, s1, pa), (gemv, _, ga) = issued[:2]
    assert (prep, gemv, s1) == ("prep_q4k_t16h", "gemv_q4_k_mma_t16h", 77)
    rec = ws.scratch_ptr + p.scratch_offsets[0]
    assert pa[:2] == [0x1000, rec] and ga[:3] == [w.ptr, rec, 0x2000]
    assert issued[2][2][0] == 0x3000 and issued[3][2][2] == 0x4000 and issued[3][1] == 78


def test_a_plan_repacks_when_its_workspace_moved(gpu):
    """Workspace.reserve() reallocates in place (a new epoch): a plan bound before packs its launches again against
    the new addresses instead of writing into the freed ones."""
    p = ops.mul_mat_plan(fakegpu.weights("q4_K", 4096, 14336), 16)
    ws = fakegpu.FakeWorkspace(p)
    old = p.bound(ws)
    ws.scratch_ptr += 1 << 20
    ws.epoch += 1
    new = p.bound(ws)
    assert new is not old and p.bound(ws) is new
    assert new.launches[0].cells[1].value == ws.scratch_ptr + p.scratch_offsets[0]


def test_tensor_maps_over_scratch_are_encoded_when_bound(gpu):
    """The wgmma GEMM's activation map points into the workspace's scratch: unknown while recording (a TMap),
    encoded (and checked against the TMA rules) when the plan is bound."""
    p = ops.mul_mat_plan(fakegpu.weights("q4_K", 4096, 4096), 512)
    gemm = p.launches[1]
    assert isinstance(gemm.args[1], plans.TMap) and isinstance(gemm.args[0], bytes)
    b = p.bound(fakegpu.FakeWorkspace(p))
    assert bytes(b.launches[1].cells[1]) == bytes(128)


def test_tensor_maps_over_the_callers_fp16_x_are_encoded_per_call(gpu, monkeypatch):
    """Where the GEMM reads an fp16 x as it is (a register-A build in x's natural K order), its activation map is over
    the call's x: a TMap on x in the plan, encoded in Bound.run for each x address (the first call at an address,
    then memoised) and written into the launch's parameter; the scratch-free plan launches the GEMM alone."""
    from ptxgen.runtime import tma

    enc = []

    def fake_map(ptr, dtype, rows, cols, box_rows, box_cols, swizzle="128B", row_stride_bytes=None, chunks=0):
        tma.check_tensor_map_2d(ptr, dtype, rows, cols, box_rows, box_cols, swizzle, row_stride_bytes, chunks)
        enc.append((ptr, rows, cols, box_rows))
        return ptr.to_bytes(8, "little") + bytes(120)
    monkeypatch.setattr(tma, "tensor_map_2d", fake_map)
    p = ops.mul_mat_plan(fakegpu.weights("q4_K", 4096, 4096), 512, x_dtype="float16")
    assert p.kernels == ["mmq_q4_k_wgmma_ra_n256_cs"]
    tx = p.launches[0].args[1]
    assert isinstance(tx, plans.TMap) and tx.ptr.base == "x" and (tx.rows, tx.cols, tx.box_rows) == (512, 4096, 256)
    b = p.bound(fakegpu.FakeWorkspace(p))
    monkeypatch.setattr(type(b.launches[0]), "run", lambda self, stream: None, raising=False)
    cell = b.launches[0].cells[1]
    for x_ptr in (0x7000_0000, 0x7100_0000, 0x7000_0000):
        b.run(x_ptr, 0x9000_0000, 0)
        assert bytes(cell)[:8] == x_ptr.to_bytes(8, "little")
    assert [e[0] for e in enc if e[1:] == (512, 4096, 256)] == [0x7000_0000, 0x7100_0000]  # the third: memoised
    with pytest.raises(ValueError):  # TMA's 16-byte rule, checked before the driver
        b.run(0x7000_0008, 0x9000_0000, 0)


def test_workspace_for_picks_per_stream_per_capture_or_the_given_one(gpu, monkeypatch):
    made = []

    class FakeWS:
        def __init__(self, counters, ready, scratch, stream=None):
            self.counter_bytes, self.ready_bytes, self.scratch_bytes, self.stream = counters, ready, scratch, stream
            self.nbytes = counters + ready + scratch
            made.append(self)

        fits = plans.Workspace.fits
        need = plans.Workspace.need

        def grown_for(self, plan, stream):
            return FakeWS(max(self.counter_bytes, plan.counter_bytes), max(self.ready_bytes, plan.ready_bytes),
                          max(self.scratch_bytes, plan.scratch_bytes), stream)

    class Relaxed:
        def __enter__(self):
            made.append("relaxed")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(plans, "Workspace", FakeWS)
    monkeypatch.setattr(plans, "_EAGER", {})
    monkeypatch.setattr(plans, "_CAPTURED", {})
    monkeypatch.setattr(driver, "relaxed_capture", Relaxed)
    w = fakegpu.weights("q4_K", 4096, 4096)
    small, big = ops.mul_mat_plan(w, 1), ops.mul_mat_plan(w, 512)
    a = plans.workspace_for(small, 5)
    assert plans.workspace_for(small, 5) is a and a.stream == 5  # one per stream, in that stream's order
    assert plans.workspace_for(small, 6) is not a
    grown = plans.workspace_for(big, 5)
    assert grown is not a and grown.fits(small) and grown.fits(big) and plans.workspace_for(small, 5) is grown
    t1 = plans.workspace_for(small, PER_THREAD_STREAM)
    import threading
    other = []
    th = threading.Thread(target=lambda: other.append(plans.workspace_for(small, PER_THREAD_STREAM)))
    th.start()
    th.join()
    assert other[0] is not t1  # the per-thread stream is a different stream in each thread
    monkeypatch.setattr(driver, "capture_id", lambda stream: 41 if stream == 5 else None)
    c = plans.workspace_for(small, 5)  # capturing: the capture's own, made outside the graph
    assert c is not grown and c.stream is None and "relaxed" in made and plans.workspace_for(small, 5) is c
    c2 = plans.workspace_for(big, 5)
    assert c2 is not c and plans._CAPTURED[41] == [c, c2]  # the first stays alive: the graph holds it
    mine = FakeWS(1 << 16, 1 << 12, small.scratch_bytes)
    with pytest.raises(ValueError, match="workspace too small"):
        plans.workspace_for(big, 5, mine)
    assert plans.workspace_for(small, 5, mine) is mine
    assert plans.release_capture_workspaces() >= 0 and not plans._CAPTURED


# --- streams -------------------------------------------------------------------------------------------------

def test_stream_argument_forms():
    class CoreStream:  # cuda.core's protocol
        def __cuda_stream__(self):
            return (0, 0x1234)

    class TorchLike:
        cuda_stream = 0x55

    class CupyLike:
        ptr = 0x66

    assert stream_handle(None) == PER_THREAD_STREAM  # nothing to follow: the per-thread default stream
    assert stream_handle(None, np.zeros(3)) == PER_THREAD_STREAM
    assert stream_handle(0) == 0 and stream_handle(np.uint64(7)) == 7
    assert stream_handle(CoreStream()) == 0x1234
    assert stream_handle(TorchLike()) == 0x55 and stream_handle(CupyLike()) == 0x66
    with pytest.raises(ValueError, match="non-negative"):
        stream_handle(-1)
    for bad in ("0x10", 1.5, True, object()):
        with pytest.raises(TypeError, match="stream: expected"):
            stream_handle(bad)

    class BadProto:
        def __cuda_stream__(self):
            return 5

    with pytest.raises(TypeError, match="must return"):
        stream_handle(BadProto())


def test_prepared_launch_packs_the_cuda_launch_config(gpu):
    """cuLaunchKernelEx's config for a cluster / PDL launch: the grid, block, shared memory and the attributes
    (cluster dims, programmatic stream serialization) at the driver's offsets; the stream set per call."""
    fn = fakegpu.FakeFunction(ops.kernels.entry("mmq_q4_k_wgmma_ra_n256_mc2", "sm_90a"), "sm_90a")
    pl = fn.prepare((264,), [ctypes.c_uint32(0)] * len(fn.params), smem=1000, cluster=(2, 1, 1), pdl=True)
    cfg = pl._cfg
    assert (cfg.gridDimX, cfg.gridDimY, cfg.blockDimX, cfg.sharedMemBytes, cfg.numAttrs) == (264, 1, fn.block[0], 1000, 2)
    assert ctypes.sizeof(driver._LaunchAttr) == 72 and driver._LaunchConfig.hStream.offset == 32
    a0, a1 = cfg.attrs[0], cfg.attrs[1]
    assert (a0.id, list(a0.value[:3]), a1.id, a1.value[0]) == (4, [2, 1, 1], 6, 1)
    assert fn.prepare((1,), [ctypes.c_uint32(0)] * len(fn.params))._cfg.numAttrs == 0  # a plain launch


def test_the_register_a_tile_shrinks_on_shapes_of_few_tiles(gpu):
    """The register-A MMQ's token tile halves (n256 → n128 → n64) while its plan would split K more than
    RULES.wgmma_ra_max_splits ways or into fewer than RULES.wgmma_ra_min_split_steps K-steps: Llama's k / v
    projections (1024 x 4096) at prefill; the large shapes keep the T rule's tile; a forced tile stays."""
    def gemm(m, k, t):  # (the tile's build, split in clusters or not: the _cs twin)
        return next(n for n in ops.mul_mat_plan(fakegpu.weights("q4_K", m, k), t).kernels
                    if "wgmma_ra" in n).removesuffix("_cs")
    assert gemm(1024, 4096, 512) == "mmq_q4_k_wgmma_ra_n128"
    assert gemm(1024, 4096, 256) == "mmq_q4_k_wgmma_ra_n64"
    assert gemm(4096, 14336, 256) == gemm(4096, 14336, 512) == gemm(4096, 4096, 512) == "mmq_q4_k_wgmma_ra_n256"
    assert next(n for n in ops.mul_mat_plan(fakegpu.weights("q8_0", 1024, 4096), 512).kernels
                if "wgmma_ra" in n).removesuffix("_cs") == "mmq_q8_0_wgmma_ra_n128"  # the codecs' builds alike
    with tuning.override(wgmma_ra_max_splits=64, wgmma_ra_min_split_steps=1):
        assert gemm(1024, 4096, 512) == "mmq_q4_k_wgmma_ra_n256"


NO_CODEC_FEW = {"q5_K": 32}  # codec_few_max_tokens without Q6_K's and Q8_0's few-token builds (the routes after them)


def test_q6_k_and_q8_0_decode_runs_the_few_token_builds_where_the_rules_say(gpu):
    """Q6_K and Q8_0 up to 8 tokens (RULES.codec_few_max_tokens: 16, 9-16 on fp16 activations) run the one-warp-ring
    few-token builds on prep_sub16_t*'s
    records (eager calls to 4 tokens: the fused build, records and GEMV in one launch); one-token calls below
    RULES.codec_few_t1_min_weights that the fp32 codec GEMV would run keep it; Q6_K rows at a 2-byte phase (K/256
    odd) run the routes after them."""
    tuning.set(few_i8_max_tokens={"q4_K": 2})  # (the fp16 builds: the other formats' int8 ones off)
    for fmt in ("q6_K", "q8_0"):
        w = fakegpu.weights(fmt, 4096, 14336)
        assert ops.mul_mat_plan(w, 1).kernels == [f"gemv_{fmt.lower()}_mma_t1_fused"]
        for t, n in ((2, 2), (3, 4), (8, 8)):
            assert ops.mul_mat_plan(w, t).kernels[-1].removesuffix("_fused") == f"gemv_{fmt.lower()}_mma_t{n}", t
        small = fakegpu.weights(fmt, 1024, 4096)
        assert ops.mul_mat_plan(small, 1).kernels == [f"gemv_{fmt.lower()}_f32_t1"]
        assert ops.mul_mat_plan(small, 2).kernels[-1].removesuffix("_fused") == f"gemv_{fmt.lower()}_mma_t2"
        with tuning.override(codec_few_t1_min_weights=0):
            assert ops.mul_mat_plan(small, 1).kernels == [f"gemv_{fmt.lower()}_mma_t1_fused"]
    assert ops.mul_mat_plan(fakegpu.weights("q6_K", 128256, 4096), 1).kernels == ["gemv_q6_k_mma_t1_fused"]
    # rows of 2-byte phase (K/256 odd: 3328) run the routes after them; K = 3584 (rows of 4-byte multiples) does not
    assert ops.mul_mat_plan(fakegpu.weights("q6_K", 4096, 3328), 2).kernels == ["gemv_q6_k_f32_t2"]
    assert ops.mul_mat_plan(fakegpu.weights("q6_K", 4096, 3584), 2, graph=True).kernels[-1] == "gemv_q6_k_mma_t2"
    # a small one-token call the codecs' tensor-core GEMV would run (M ≥ codec_mma_t1_min_rows) takes the few build
    assert ops.mul_mat_plan(fakegpu.weights("q8_0", 4096, 3584), 1).kernels == ["gemv_q8_0_mma_t1_fused"]


def test_q5_k_small_one_token_calls_run_its_codec_gemv_with_k_parts(gpu):
    """Q5_K's one-token calls below RULES.codec_few_t1_min_weights run gemv_q5_k_f32_t1 (one launch, no prep) with
    the kparts RULES.codec_gemv_t1_max_ctas gives (1024x4096: 4, 2048x4096: 2), on fp32 and fp16 x; larger ones and
    two tokens keep the few-token builds."""
    for (m, k), kp in (((1024, 4096), 4), ((2048, 4096), 2), ((512, 3584), 4)):
        for dt in ("float32", "float16"):
            p = ops.mul_mat_plan(fakegpu.weights("q5_K", m, k), 1, x_dtype=dt)
            assert p.kernels == ["gemv_q5_k_f32_t1" + ("_x16" if dt == "float16" else "")], (m, k, dt, p.kernels)
            assert p.launches[0].args[-1] == kp and p.launches[0].grid == (-(-m * kp // 16),), (m, k, p.launches[0])
    assert ops.mul_mat_plan(fakegpu.weights("q5_K", 1024, 4096), 2).kernels[-1] != "gemv_q5_k_f32_t1"
    assert ops.mul_mat_plan(fakegpu.weights("q5_K", 4096, 4096), 1).kernels[-1] != "gemv_q5_k_f32_t1"


def test_q6_k_register_a_gemm_runs_where_its_rules_and_its_rows_allow(gpu, frags, monkeypatch):
    """Q6_K's register-A GEMM (240-byte TMA boxes over its 210-byte blocks) from RULES.codec_ra_mmq_min_tokens to
    RULES.codec_ra_mmq_max_tokens on sm_90: on rows that are 16-byte multiples (K a multiple of 2048: 4096, 14336)
    as they are, on others (Qwen's 3584, 18944) in groups of 8 rows (the _g8 builds, kernels/mmq.py ROW_GROUP_NOTE)
    where M is a multiple of 8; the prepared route where M is not, and above."""
    from ptxgen.runtime import tma

    w = fakegpu.weights("q6_K", 4096, 4096)
    with tuning.override(codec_ra_mmq_min_tokens=9, codec_ra_mmq_max_tokens=1024, codec_few_max_tokens=NO_CODEC_FEW):
        assert ops.mul_mat_plan(w, 512).kernels == ["convert_f16", "mmq_q6_k_wgmma_ra_n256_cs", "mul_mat_fixup_q6_k"]
        assert ops.mul_mat_plan(w, 9).kernels[1] == "mmq_q6_k_wgmma_ra_n64"
        assert ops.mul_mat_plan(w, 1025).kernels[0] == "dequantize_q6_k_frags"
        assert ops.mul_mat_plan(w, 8).kernels == ["prep_mma_f16", "gemv_q6_k_mma_tma"]
        for m, k in ((4096, 3584), (3584, 18944), (136, 768)):
            wg = fakegpu.weights("q6_K", m, k)
            assert ops.mul_mat_plan(wg, 9).kernels[1] == "mmq_q6_k_wgmma_ra_n64_g8"
            assert re.fullmatch(r"mmq_q6_k_wgmma_ra_n(64|128|256)_g8(_cs)?", ops.mul_mat_plan(wg, 512).kernels[1])
            assert re.fullmatch(r"mmq_q6_k_wgmma_ra_n(64|128|256)_g8(_cs)?",
                                ops.mul_mat_plan(wg, 512, x_dtype="float16").kernels[0])
        maps, encode = [], tma.tensor_map_2d  # the raw rows' map: 8-row groups, boxes of 16 group rows
        monkeypatch.setattr(tma, "tensor_map_2d", lambda *a, **kw: maps.append(a) or encode(*a, **kw))
        monkeypatch.setattr(ops, "_TMAPS", {})
        wg = fakegpu.weights("q6_K", 4096, 3584)
        ops.mul_mat_plan(wg, 64)
        assert (wg.ptr, "u8", 4096 // 8, 8 * 14 * 210, 16, 240, "none") in maps
        assert ops.mul_mat_plan(fakegpu.weights("q6_K", 4100, 3584), 512).kernels[0] == "dequantize_q6_k_frags"


@pytest.fixture
def no_codec_few():
    with tuning.override(codec_few_max_tokens=NO_CODEC_FEW):
        yield


def test_the_codecs_tensor_core_gemv_runs_where_its_rules_and_the_weights_allow(gpu, no_codec_few):
    """Q6_K's and Q8_0's tensor-core decode GEMV (prep_mma_f16, then gemv_<fmt>_mma) from
    RULES.codec_mma_min_tokens to RULES.codec_mma_max_tokens on sm_90a: the TMA build where a row is a multiple of
    16 bytes, the bulk-copy build where it is a multiple of 4 and the weights end on a 16-byte boundary; the fp32
    codec GEMV where neither holds, outside the rules (T = 1 below RULES.codec_mma_t1_min_rows rows), off sm_90a.
    (Where the few-token builds run Q6_K and Q8_0, RULES.codec_few_max_tokens, they come first: off here.)"""
    w = fakegpu.weights("q6_K", 4096, 14336)
    tc = ["prep_mma_f16", "gemv_q6_k_mma_tma"]
    assert ops.mul_mat_plan(w, 1).kernels == ["gemv_q6_k_f32_t1"]  # as shipped: T = 2-8, and T = 1 for M large
    assert ops.mul_mat_plan(fakegpu.weights("q6_K", 128256, 4096), 1).kernels == tc  # RULES.codec_mma_t1_min_rows
    assert ops.mul_mat_plan(fakegpu.weights("q8_0", 4096, 14336), 1).kernels == ["prep_mma_f16", "gemv_q8_0_mma_tma"]
    assert ops.mul_mat_plan(fakegpu.weights("q8_0", 1024, 4096), 1).kernels == ["gemv_q8_0_f32_t1"]
    assert ops.mul_mat_plan(fakegpu.weights("q6_K", 152064, 3584), 1).kernels == ["prep_mma_f16", "gemv_q6_k_mma"]
    assert ops.mul_mat_plan(w, 2).kernels == ops.mul_mat_plan(w, 8).kernels == tc
    with tuning.override(codec_mma_min_tokens=1, codec_mma_max_tokens=8):
        assert ops.mul_mat_plan(w, 1).kernels == ops.mul_mat_plan(w, 8).kernels == tc
        # rows of 2940 bytes (K = 3584: 14 super-blocks): 4-byte multiples, not 16 — the bulk-copy build
        assert ops.mul_mat_plan(fakegpu.weights("q6_K", 4096, 3584), 3).kernels == ["prep_mma_f16", "gemv_q6_k_mma"]
        assert ops.mul_mat_plan(fakegpu.weights("q6_K", 4099, 256), 1).kernels == ["gemv_q6_k_f32_t1"]
        assert ops.mul_mat_plan(w, 2, arch="sm_89").kernels == ["gemv_q6_k_f32_t2"]
        assert ops.mul_mat_plan(fakegpu.weights("q6_K", 4096, 3328), 2).kernels == ["gemv_q6_k_f32_t2"]  # K/256 odd
        assert ops.mul_mat_plan(fakegpu.weights("q6_K", 4098, 512), 2).kernels == ["gemv_q6_k_f32_t2"]  # M·row % 16
        assert ops.mul_mat_plan(fakegpu.weights("q6_K", 4096, 14336, at=fakegpu.BASE + 8), 2).kernels == \
            ["gemv_q6_k_f32_t2"]  # weights 8 bytes off a 16-byte boundary
        assert ops.mul_mat_plan(fakegpu.weights("q8_0", 4096, 14336), 4).kernels == ["prep_mma_f16",
                                                                                     "gemv_q8_0_mma_tma"]
        assert ops.mul_mat_plan(fakegpu.weights("q8_0", 4096, 4128), 4).kernels == ["gemv_q8_0_f32_t4"]  # K % 256
    with tuning.override(codec_mma_max_tokens=16):  # 9-16 tokens: two preps, the two-group build, ahead of the GEMMs
        assert ops.mul_mat_plan(w, 16).kernels == ["prep_mma_f16", "prep_mma_f16", "gemv_q6_k_mma_n16"]
        assert ops.mul_mat_plan(w, 17).kernels[1] == "mmq_q6_k_wgmma_ra_n64"
    with tuning.override(codec_mma_max_tokens=0):
        assert ops.mul_mat_plan(w, 1).kernels == ["gemv_q6_k_f32_t1"]


def test_the_codecs_prefill_on_the_mma_sync_targets(gpu, codec_gemvs):
    """Q5_K, Q6_K and Q8_0 from RULES.codec_f16_mmq_min_tokens on the mma.sync targets (sm_89, sm_120a, or an sm_90
    device with arch pinned there): the fp16 mma.sync MMQ decoding the codec's blocks (its fp32 x converted inside,
    or convert_f16 first for large products), then the codec's fixup; the decode GEMVs below; K not a multiple of
    256 (a partial super-block) stays on the GEMV slices."""
    for fmt in ("q5_K", "q6_K", "q8_0"):
        w = fakegpu.weights(fmt, 4096, 4096)
        f = fmt.lower()
        first = ops.RULES.codec_f16_mmq_min_tokens[fmt]
        assert ops.mul_mat_plan(w, 8, arch="sm_89").kernels == [f"gemv_{f}_f32_t8"]
        assert ops.mul_mat_plan(w, first - 1, arch="sm_89").kernels[0].startswith(f"gemv_{f}_f32_t")
        assert ops.mul_mat_plan(w, max(first, 9), arch="sm_89").kernels == [f"mmq_{f}_f16_n32", f"mul_mat_fixup_{f}"]
        assert ops.mul_mat_plan(w, 100, arch="sm_89").kernels == [f"mmq_{f}_f16_n128", f"mul_mat_fixup_{f}"]
        assert ops.mul_mat_plan(w, 512, arch="sm_89").kernels == ["convert_f16", f"mmq_{f}_f16_n128_x16",
                                                                  f"mul_mat_fixup_{f}"]
    assert ops.mul_mat_plan(fakegpu.weights("q8_0", 4096, 4160), 64, arch="sm_89").kernels[0] == "gemv_q8_0_f32_t8"


def test_tq4_1s_prefills_on_the_mma_sync_targets_on_its_rotated_x(gpu):
    """TQ4_1S from RULES.codec_f16_mmq_min_tokens on the mma.sync targets (where its tensor-core GEMV is built,
    sm_120a, past RULES.codec_tc_slices_max_tokens): x rotated once (rotate_tq4_1s, into scratch), the fp16 mma.sync MMQ decoding its blocks with the codec's run8 (rotated-domain weights) on that
    rotated x — convert_f16 first for large products — and the fixup on the same rotated x; the decode GEMV below;
    K not a multiple of 256 stays on the GEMV slices."""
    w = fakegpu.weights("tq4_1s", 4096, 4096)
    first = ops.RULES.codec_f16_mmq_min_tokens["tq4_1s"]
    assert ops.mul_mat_plan(w, first - 1, arch="sm_89").kernels[-1].startswith("gemv_tq4_1s_t")
    # sm_120a builds TQ4_1S's tensor-core GEMV: its slices first, to RULES.codec_tc_slices_max_tokens (sm_89 has none)
    tc = ops.RULES.codec_tc_slices_max_tokens["tq4_1s"]
    assert ops.mul_mat_plan(w, tc, arch="sm_120a").kernels[-1].startswith("gemv_tq4_1s_mma")
    assert ops.mul_mat_plan(w, max(first, 9), arch="sm_89").kernels[1] == "mmq_tq4_1s_f16_n32"
    for arch in ("sm_89", "sm_120a"):
        p = ops.mul_mat_plan(w, max(first, 9, tc + 1), arch=arch)
        assert p.kernels == ["rotate_tq4_1s", "mmq_tq4_1s_f16_n32", "mul_mat_fixup_tq4_1s"]
        rot = p.launches[0].args[1]
        assert rot != p.launches[0].args[0]
        assert p.launches[1].args[1] == rot and p.launches[2].args[3] == rot  # the GEMM's x, the fixup's x
        p = ops.mul_mat_plan(w, 512, arch=arch)  # the fp16 copy (x's order) by the rotation's launch
        assert p.kernels == ["rotate_tq4_1s_f16", "mmq_tq4_1s_f16_n128_x16", "mul_mat_fixup_tq4_1s"]
        x, rot, rot16, _, _, mode = p.launches[0].args
        assert mode == 0 and p.launches[2].args[3] == rot
        assert p.launches[1].args[1].ptr == rot16.ptr  # (sm_120a: a tensor map over it)
    assert ops.mul_mat_plan(fakegpu.weights("tq4_1s", 4096, 4160), 64, arch="sm_89").kernels[-1] == "gemv_tq4_1s_t8"
    with pytest.raises(ValueError, match="rotated first"):  # the benchmarks' GEMM-alone launch takes x as given
        ops.mmq_launch(w, None, None, 64, 0, arch="sm_89")


def test_a_q4_k_only_gemm_path_refuses_another_codec(gpu):
    """The MMQ paths that decode Q4_K only (wgmma, the int8 Q8_1 ones) refuse another codec's weights with a
    ValueError naming both, never running Q4_K's kernel on them; its mma.sync, register-A and prepared builds
    record."""
    from ptxgen.runtime.plans import PlanBuilder

    w = fakegpu.weights("q6_K", 4096, 4096)
    for path in ("wgmma", "q8", "q8_pre"):
        pb = PlanBuilder((64, 4096), np.float32, (64, 4096), np.float32)
        with pytest.raises(ValueError, match=f"{path!r}.*q6_K|q6_K.*{path!r}"):
            ops._rec_mmq(pb, w, pb.x, pb.y, 64, pb.flag, None, path=path)
    pb = PlanBuilder((64, 4096), np.float32, (64, 4096), np.float32)
    ops._rec_mmq(pb, w, pb.x, pb.y, 64, pb.flag, "sm_89", path="mma.sync")
    assert [ln.fn.name for ln in pb.launches] == ["mmq_q6_k_f16_n64"]


def test_a_forced_converting_gemm_refuses_k_that_is_not_whole_conversion_units(gpu):
    """The converting builds walk x in units of 64·convert_steps columns (the prepared one: 128): a K past the last
    whole unit is refused with a clear error where a caller forces the path (mul_mat's own rule never picks it)."""
    w = fakegpu.weights("q8_0", 256, 320)
    with pytest.raises(ValueError, match="converts x in units of 128 columns; K = 320"):
        ops.recorded_plan(w, 2048, lambda pb: ops._rec_mmq(pb, w, pb.x, pb.y, 2048, pb.flag, None, None, "wgmma_pre_cx"))
    assert "mmq_q4_k_wgmma_pre_n256_cx" not in ops.mul_mat_plan(w, 2048).kernels


def test_the_default_stream_of_a_torch_tensor_subclass_is_torchs_current_stream(monkeypatch):
    """An op's default stream for a torch input is torch's current stream, for a subclass of torch.Tensor defined
    anywhere too (as the hot paths take it); a negative raw handle is refused."""
    torch = pytest.importorskip("torch")
    from ptxgen.runtime import driver

    class MyTensor(torch.Tensor):
        pass

    monkeypatch.setattr(driver, "_torch_current_stream", lambda index: 77)
    assert driver.stream_handle(None, torch.zeros(2).as_subclass(MyTensor)) == 77
    with pytest.raises(ValueError, match="non-negative"):
        driver.stream_handle(-1)


def test_tq4_1s_takes_its_register_a_gemm_from_its_rule(gpu):
    """TQ4_1S's register-A GEMM (codec_ra_mmq_min_tokens[tq4_1s], 17 on the H200): from the rule, x rotated once
    (with its fp16 copy, rotate_tq4_1s_f16), mmq_tq4_1s_wgmma_ra_n<tile>, the fixup — no fragment pass; with the rule past T the prepared
    route."""
    w = fakegpu.weights("tq4_1s", 18944, 3584)
    assert ops.mul_mat_plan(w, 17).kernels[1] == "mmq_tq4_1s_wgmma_ra_n64"  # shipped
    assert ops.mul_mat_plan(w, 16).kernels[-1] == "gemv_tq4_1s_mma"
    with tuning.override(codec_ra_mmq_min_tokens=dict(ops.RULES.codec_ra_mmq_min_tokens, tq4_1s=1 << 30)):
        assert ops.mul_mat_plan(w, 512).kernels[:2] == ["rotate_tq4_1s_f16", "dequantize_tq4_1s_frags"]
    with tuning.override(codec_ra_mmq_min_tokens=dict(ops.RULES.codec_ra_mmq_min_tokens, tq4_1s=40)):
        assert ops.mul_mat_plan(w, 512).kernels == ["rotate_tq4_1s_f16", "mmq_tq4_1s_wgmma_ra_n256",
                                                    "mul_mat_fixup_tq4_1s"]
        assert ops.mul_mat_plan(w, 64).kernels[1] == "mmq_tq4_1s_wgmma_ra_n64"
        new = ops.mul_mat_plan(w, 512).kernels
        with knobs.override(PTXGEN_ROTATE_F16="0"):  # the launches before rotate_tq4_1s_f16, for A/B
            assert ops.mul_mat_plan(w, 512).kernels == ["rotate_tq4_1s", "convert_f16_perm"] + new[1:]
            assert ops.mul_mat_plan(w, 512, x_dtype="float16").kernels == ["convert_f32", "rotate_tq4_1s",
                                                                           "convert_f16_perm"] + new[1:]
        assert ops.mul_mat_plan(w, 39).kernels[0] != "rotate_tq4_1s_f16" or \
            ops.mul_mat_plan(w, 39).kernels[1] == "dequantize_tq4_1s_frags"


def test_small_one_token_q4_k_calls_run_the_codec_gemv_where_the_rule_says(gpu):
    """The route small_gemv: one-token calls on fewer than RULES.codec_gemv_t1_max_weights weights run
    gemv_<fmt>_f32_t1 (fp32 x, one launch, no prep), ahead of the decode route; more tokens or weights do not."""
    small, big = fakegpu.weights("q4_K", 1024, 4096), fakegpu.weights("q4_K", 4096, 14336)
    with tuning.override(codec_gemv_t1_max_weights={"q4_K": 1 << 24}):
        assert ops.mul_mat_plan(small, 1).kernels == ops.mul_mat_plan(small, 1, graph=True).kernels == [
            "gemv_q4_k_f32_t1"]
        assert "gemv_q4_k_f32_t1" not in ops.mul_mat_plan(small, 2).kernels
        assert "gemv_q4_k_f32_t1" not in ops.mul_mat_plan(big, 1).kernels
    with tuning.override(codec_gemv_t1_max_weights={"q4_K": 0}):
        assert "gemv_q4_k_f32_t1" not in ops.mul_mat_plan(small, 1).kernels
    # its K parts (RULES.codec_gemv_t1_max_ctas): the grid of the rows' CTAs at that many parts, the parameter last
    for m, k, cap, kp in ((1024, 4096, 256, 4), (1024, 4096, 128, 2), (512, 3584, 256, 4), (1024, 4096, 0, 1)):
        with tuning.override(codec_gemv_t1_max_ctas={"q4_K": cap}):
            for dt in ("float32", "float16"):
                (ln,) = ops.mul_mat_plan(fakegpu.weights("q4_K", m, k), 1, x_dtype=dt).launches
                assert ln.fn.meta["kparts_param"] and ln.args[-1] == kp, (m, k, cap, dt, ln.args)
                assert ln.grid == (-(-m * kp // ln.fn.meta["rows_per_cta"]),), (m, k, cap, ln.grid)


def test_tq4_1s_one_token_takes_the_product_table_gemv_under_its_rule(gpu):
    """RULES.xtab_max_tokens (off: slower in a graph) sends a one-token TQ4_1S call to gemv_tq4_1s_xt_t1 alone (it
    reads x unrotated: no prep), eager and captured alike, over ceil(M / rows_per_cta) row CTAs and K splits that
    fill the GPU; wider calls, sm_89 (no build),
    K not a multiple of 128 (its tensor map) and the default rule keep the lane GEMVs. The launch binds, waits at its head (PDL) and takes fp16 x through
    the one conversion the fp32-x kernels get."""
    sms = driver.current().sm_count
    with tuning.override(xtab_max_tokens={"tq4_1s": 1}):
        small = fakegpu.weights("tq4_1s", 100, 96)
        assert ops.mul_mat_plan(small, 1, rotation="separate").kernels[-1] == "gemv_tq4_1s_t1"
    for m, k in ((18944, 3584), (3584, 18944), (4096, 4096), (100, 128)):
        w = fakegpu.weights("tq4_1s", m, k)
        assert ops.mul_mat_plan(w, 1, graph=True).kernels[-1] != "gemv_tq4_1s_xt_t1"
        assert ops.mul_mat_plan(w, 1).kernels[-1] != "gemv_tq4_1s_xt_t1"  # (eager too: the same bits as a graph)
        with tuning.override(xtab_max_tokens={"tq4_1s": 1}):
            p = ops.mul_mat_plan(w, 1)
            assert p.kernels == ["gemv_tq4_1s_xt_t1"], (m, k, p.kernels)
            ctas, splits = p.launches[0].grid
            assert ctas == -(-m // p.launches[0].fn.meta["rows_per_cta"]) and 1 <= splits and ctas * splits <= sms, (m, k, p.launches[0].grid)
            assert p.launches[0].pdl and p.launches[0].fn.meta["pdl_head"]
            p.bound(fakegpu.FakeWorkspace(p))
            assert ops.mul_mat_plan(w, 2).kernels[-1] != "gemv_tq4_1s_xt_t1"
            assert ops.mul_mat_plan(w, 1, arch="sm_89").kernels[-1] != "gemv_tq4_1s_xt_t1"
            h = ops.mul_mat_plan(w, 1, x_dtype="float16")
            assert h.kernels[-1] == "gemv_tq4_1s_xt_t1" and len(h.kernels) == 2, h.kernels
            h.bound(fakegpu.FakeWorkspace(h))


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"])
def test_a_captured_call_plans_the_math_of_the_eager_one(gpu, fmt):
    """A user who captures their step in a CUDA graph gets the bits they got eager: where a plan keyed by graph differs
    (the one-launch builds eager, for the host's launch), the eager kernel is the one-launch twin of the graph's prep +
    GEMV (gemv_*_fused(_x16): the same records built by the CTA, the same sums; bit-identical on the GPU by
    test_gpu_gemv's few-token tests) and nothing else differs. A rule that sent eager calls to a GEMV summing in another
    order (an eager-only product-table rule did, 2026-12-06) fails here, not first in a user's graph."""
    def math(kernels, fused):
        out = [n for n in kernels if not (fused and n.startswith("prep_"))]
        return [re.sub(r"_fused(_x16)?$", "", n) for n in out]

    for m, k in ((64, 4096), (512, 3584), (1024, 4096), (4096, 4096), (4096, 14336), (14336, 4096)):
        w = fakegpu.weights(fmt, m, k)
        for t in (1, 2, 3, 4, 8, 9, 17, 40, 512):
            for dt in ("float32", "float16"):
                for mode in ("exact", "fast"):
                    e = ops.mul_mat_plan(w, t, x_dtype=dt, mode=mode).kernels
                    g = ops.mul_mat_plan(w, t, graph=True, x_dtype=dt, mode=mode).kernels
                    fused = any(re.search(r"_fused(_x16)?$", n) for n in e)
                    assert e == g or (fused and math(e, True) == math(g, True)), (m, k, t, dt, mode, e, g)


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"])
def test_an_fp16_x_plans_the_math_of_its_fp32_widening(gpu, fmt):
    """mul_mat promises an fp16 x the bits of the same values in fp32: its plan runs the fp32 plan's kernels, where
    they read x as the _x16 twins (the same math on widened loads) and without the launches that only convert x
    (convert_f32 / convert_f16 / permute_f16 / copy_f16, the converting GEMMs' _cx, a rotation's, the fixup behind
    an fp16 conversion). Bit-identity on the GPU: test_gpu_gemv's fp16 tests; this catches a rule that sends one
    dtype elsewhere (rotation="auto" did, 2026-12-06: fp32 x to the fused GEMV, fp16 x to its prep + the TMA GEMV)."""
    def math(kernels):
        return [re.sub(r"(_cx)?(_x16)?$", "", n) for n in kernels
                if not re.match(r"(convert_f|permute_f16|copy_f16|mul_mat_fixup|rotate_tq4_1s)", n)]

    for m, k in ((64, 4096), (512, 3584), (1024, 4096), (4096, 4096), (4096, 14336), (14336, 4096)):
        w = fakegpu.weights(fmt, m, k)
        for t in (1, 2, 3, 4, 8, 9, 17, 40, 512, 4096):
            for mode in ("exact", "fast"):
                for graph in (False, True):
                    a = ops.mul_mat_plan(w, t, mode=mode, graph=graph).kernels
                    b = ops.mul_mat_plan(w, t, mode=mode, graph=graph, x_dtype="float16").kernels
                    assert math(a) == math(b), (m, k, t, mode, graph, a, b)


def test_split_register_a_gemms_take_the_cluster_split_build_under_its_rule(gpu, monkeypatch):
    """RULES.mmq_cluster_split_max_splits raised to 4 (2 as shipped: the 4-split builds have not run on a GPU): a
    register-A GEMM whose plan splits K 2-4 ways (Q4_K / Q6_K 1024x4096 and 4096x4096 at T = 512, fp32 x after
    convert_f16 or fp16 x as it is) runs its _cs build — grid tiles x splits in clusters of splits, the same
    arguments —; unsplit plans, the rule at 0 and a GPU holding fewer clusters than tiles (an H100 for 32 clusters
    of 4, 2026-12-06) keep the split build; the forced path refuses a plan it cannot launch."""
    with tuning.override(mmq_cluster_split_max_splits=4):
        for fmt, m, k, bn, splits in (("q4_K", 1024, 4096, 128, 4), ("q4_K", 4096, 4096, 256, 2),
                                      ("q6_K", 1024, 4096, 128, 4), ("q4_K", 4096, 14336, 256, 2)):
            w = fakegpu.weights(fmt, m, k)
            for dt in ("float32", "float16"):
                p = ops.mul_mat_plan(w, 512, x_dtype=dt)
                name = f"mmq_{fmt.lower()}_wgmma_ra_n{bn}_cs"
                assert name in p.kernels, (fmt, m, k, dt, p.kernels)
                ln = next(ln for ln in p.launches if ln.fn.name == name)
                tiles = -(-m // 128) * -(-512 // bn)
                assert ln.grid == (tiles * splits,) and ln.cluster == (splits, 1, 1), (ln.grid, ln.cluster)
                assert ln.args[9] == splits  # (the split builds' arguments: ... tiles_n, splits, part, counters)
        assert not any(n.endswith("_cs") for n in ops.mul_mat_plan(fakegpu.weights("q4_K", 14336, 4096), 512).kernels)
        monkeypatch.setattr(fakegpu.FakeFunction, "resident_clusters", lambda self, size: 31)  # (32 tiles wanted)
        p = ops.mul_mat_plan(fakegpu.weights("q4_K", 1024, 4096), 512)
        assert "mmq_q4_k_wgmma_ra_n128" in p.kernels, p.kernels
        pb = ops.PlanBuilder((512, 4096), np.float16, (512, 1024), np.float32)
        with pytest.raises(ValueError, match="one cluster of its 4 splits a tile"):
            ops._rec_mmq(pb, fakegpu.weights("q4_K", 1024, 4096), pb.x, pb.y, 512, pb.flag, bn=128, path="wgmma_ra_cs")
    assert not any(n.endswith("_cs") for n in ops.mul_mat_plan(fakegpu.weights("q4_K", 1024, 4096), 512).kernels)


def test_a_captured_mul_mat_refuses_a_numpy_x(gpu, monkeypatch):
    """mul_mat on a stream that captures a CUDA graph refuses a NumPy x (its upload would wait on the stream, and a
    host copy of pageable memory does not belong in a graph), as mul_mat_id does; the capturing stream is named."""
    from ptxgen.runtime import driver

    monkeypatch.setattr(driver, "capture_id", lambda stream: 41 if stream == 5 else None)
    w = fakegpu.weights("q4_K", 256, 1024)
    with pytest.raises(RuntimeError, match=r"x is a NumPy array .* stream 0x5 is capturing a CUDA graph"):
        ops.mul_mat(w, np.zeros((2, 1024), np.float32), stream=5)


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0"])
def test_the_f16a_rule_turns_the_prepared_route_into_dequantize_and_the_shared_memory_gemm(gpu, fmt):
    """Rule mmq_f16a (per format): where the prepared route runs, dequantize_<fmt> writes fp16 rows and the f16a GEMM
    reads them by TMA — converting an fp32 x itself (T = 4096, one K split), an fp16 x as given (no launch before
    the GEMM but the dequantize, no fixup), an fp32 x it cannot convert itself (T < mmq_cx_min_tokens) through
    convert_f16 — on either dtype alike; TQ4_1S (no GPU dequantize) keeps its prepared fragments; a format the rule
    marks false keeps them too (shipped: Q4_K)."""
    f = fmt.lower()
    w = fakegpu.weights(fmt, 4096, 14336)
    rules = dict(mmq_pre_min_tokens=512, codec_ra_mmq_max_tokens={"q5_K": 256, "q6_K": 256, "q8_0": 256, "tq4_1s": 256})
    with tuning.override(mmq_f16a=True, **rules):
        assert ops.mul_mat_plan(w, 4096).kernels == [f"dequantize_{f}", "mmq_q4_k_wgmma_f16a_n256_cx",
                                                     f"mul_mat_fixup_{f}"]
        assert ops.mul_mat_plan(w, 4096, x_dtype="float16").kernels == [f"dequantize_{f}", "mmq_q4_k_wgmma_f16a_n256"]
        assert ops.mul_mat_plan(w, 512).kernels == [f"dequantize_{f}", "convert_f16", "mmq_q4_k_wgmma_f16a_n256",
                                                    f"mul_mat_fixup_{f}"]
        assert "dequantize_tq4_1s_frags" in ops.mul_mat_plan(fakegpu.weights("tq4_1s", 4096, 14336), 4096).kernels
    with tuning.override(mmq_f16a=False, **rules):
        assert ops.mul_mat_plan(w, 4096, x_dtype="float16").kernels[0] == f"dequantize_{f}_frags"
    with tuning.override(**rules):  # shipped
        assert ops.mul_mat_plan(w, 4096).kernels[0] == (f"dequantize_{f}_frags" if fmt == "q4_K" else f"dequantize_{f}")


@pytest.mark.parametrize("fmt", ["q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"])
def test_persistent_kernels_launch_at_most_one_resident_wave(gpu, fmt):
    """Every launch of a persistent kernel (meta grid "persistent: ...": the work-queue GEMMs) in mul_mat's and
    mul_mat_id's plans, on the shipped rules and on rules that route each T to the prepared and f16a GEMMs, has at most
    one resident wave of CTAs (resident_per_sm x SMs): a grid from another launch's arithmetic still computes the
    right result off the queue, so only this catches it (the f16a GEMM ran on dequantize's grid, 28672 CTAs, until
    c219107)."""
    from ptxgen.runtime import driver

    sms = driver.current().sm_count
    every_t = {f: 8 for f in ("q5_K", "q6_K", "q8_0", "tq4_1s")}
    variants = ({}, dict(mmq_pre_min_tokens=1, codec_ra_mmq_max_tokens=every_t, mmq_f16a=True),
                dict(mmq_pre_min_tokens=1, codec_ra_mmq_max_tokens=every_t, mmq_f16a=False))

    def check(plan, what):
        for ln in plan.launches:
            if str(ln.fn.meta.get("grid", "")).startswith("persistent"):
                ctas = int(np.prod(ln.grid))
                assert ctas <= ln.fn.resident_per_sm() * sms, (what, ln.fn.name, ln.grid)

    for rules in variants:
        with tuning.override(**rules):
            for m, k in ((300, 1024), (4096, 14336), (1024, 4096)):
                w = fakegpu.weights(fmt, m, k)
                for t in (9, 17, 40, 512, 1024, 4096):
                    for dt in ("float32", "float16"):
                        check(ops.mul_mat_plan(w, t, x_dtype=dt), (rules, m, k, t, dt))
            e = fakegpu.weights(fmt, 768, 2048, experts=8)
            for t in (1, 32, 512):
                check(ops.mul_mat_id_plan(e, t, 2), (rules, "moe", t))


@settings(max_examples=60, deadline=None)
@given(groups=st.integers(16, 2000), blocks=st.integers(1, 80), t=st.integers(9, 1024),
       x16=st.booleans())
def test_q6_k_register_a_gemm_plans_row_groups_for_every_row_length(groups, blocks, t, x16):
    """Any M of whole 8-row groups (≥ 128) and any K of whole 256-weight blocks: the register-A GEMM's plan takes the
    row build where a row is 16-byte whole (K a multiple of 2048) and the _g8 build elsewhere, and its tensor map
    passes the driver's rules (tma.check_tensor_map_2d: strides and base multiples of 16, boxes ≤ 256) — a shape
    the rows' map could not take goes nowhere it fails."""
    with pytest.MonkeyPatch.context() as mp:
        fakegpu.install(mp)
        m, k = 8 * groups, 256 * blocks
        with tuning.override(codec_ra_mmq_min_tokens={"q5_K": 9, "q6_K": 9, "q8_0": 9, "tq4_1s": 17},
                             codec_ra_mmq_max_tokens=1 << 30, codec_few_max_tokens=NO_CODEC_FEW):
            kernels = ops.mul_mat_plan(fakegpu.weights("q6_K", m, k), t,
                                       x_dtype="float16" if x16 else "float32").kernels
        gemm = next(n for n in kernels if n.startswith("mmq_"))
        assert re.fullmatch(r"mmq_q6_k_wgmma_ra_n(64|128|256)" + ("" if k % 2048 == 0 else "_g8") + "(_cs)?", gemm), \
            (m, k, t, kernels)
