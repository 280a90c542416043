"""Every launch a plan records has a grid its kernel can take, on each fake device of the dispatch table: no dimension
CUDA refuses (driver.grid_fault, which binding a plan checks too), a cluster kernel's grid a whole number of
clusters, and a persistent kernel (its manifest's grid "persistent: ...") at most the CTAs the device holds at once.
On 2026-12-07 the f16a GEMM ran on the grid of the dequantize launch before it (a name reused in ops._rec_mmq):
thousands of persistent CTAs, most finding the queue empty, right results ~230 µs late. Every CPU test passed it;
this one would not have."""
import math

import pytest

from ptxgen import codecs
from ptxgen.runtime import driver
from ptxgen.testing import fakegpu
from ptxgen.testing.dispatch import DEVICES, FORMATS, MOE_SHAPES

SHAPES = [(64, 4096), (4096, 4096), (4096, 14336), (14336, 4096), (18944, 3584)]
TOKENS = [1, 2, 5, 8, 16, 17, 33, 64, 129, 512, 1024, 4096]
MOE_TOKENS = [1, 4, 16, 32, 128, 512, 2048]


def grid_faults(plan, ctx) -> list[str]:
    """What is wrong with each launch's grid in `plan` on device `ctx` (empty when nothing is)."""
    out = []
    for ln in plan.launches:
        name, grid, meta = ln.fn.name, tuple(ln.grid) + (1,) * (3 - len(ln.grid)), ln.fn.meta
        if driver.grid_fault(grid):  # (what binding the plan would refuse: PreparedLaunch)
            out.append(f"{name}: grid {ln.grid}: {driver.grid_fault(grid)}")
        if ln.cluster is not None and any(g % c for g, c in zip(grid, tuple(ln.cluster) + (1,) * 3)):
            out.append(f"{name}: grid {ln.grid} not whole clusters of {ln.cluster}")
        if str(meta.get("grid", "")).startswith("persistent"):
            most = ctx.sm_count * int(meta.get("ctas_per_sm") or 1)
            if math.prod(grid) > most:
                out.append(f"{name}: {math.prod(grid)} persistent CTAs where {ctx.sm_count} SMs hold {most}")
    return out


@pytest.mark.parametrize("device", list(DEVICES))
def test_mul_mat_plans_launch_grids_their_kernels_take(monkeypatch, device):
    from ptxgen.runtime import ops

    ctx = DEVICES[device]
    fakegpu.install(monkeypatch, ctx)
    faults, planned = [], 0
    for fmt, modes in FORMATS:
        for mode in modes:
            for m, k in SHAPES:
                for t in TOKENS:
                    for graph in (False, True):
                        plan = ops.choose(fmt, mode, None, t, m, k, graph=graph)
                        planned += len(plan.launches)
                        faults += [f"{fmt} {mode} {m}x{k} T={t} graph={graph}: {f}" for f in grid_faults(plan, ctx)]
    assert planned and not faults, "\n".join(faults[:20])


@pytest.mark.parametrize("device", list(DEVICES))
def test_mul_mat_id_plans_launch_grids_their_kernels_take(monkeypatch, device):
    from ptxgen.runtime import ops

    ctx = DEVICES[device]
    fakegpu.install(monkeypatch, ctx)
    faults = []
    for fmt in codecs.moe():
        for e, slots, m, k in MOE_SHAPES:
            w = fakegpu.weights(fmt, m, k, experts=e)
            for t in MOE_TOKENS:
                for x_dtype in ("float32", "float16"):
                    plan = ops.mul_mat_id_plan(w, t, slots, x_dtype=x_dtype)
                    faults += [f"{fmt} {e}x{m}x{k} top-{slots} T={t} {x_dtype}: {f}" for f in grid_faults(plan, ctx)]
    assert not faults, "\n".join(faults[:20])


def test_the_check_sees_a_persistent_gemm_on_another_launchs_grid(monkeypatch):
    """The 2026-12-07 bug, replayed: the f16a GEMM given dequantize's grid is reported."""
    from ptxgen.runtime import ops

    ctx = DEVICES["sm_90 H200"]
    fakegpu.install(monkeypatch, ctx)
    plan = ops.choose("q5_K", "exact", None, 4096, 4096, 14336)
    names = plan.kernels
    assert any(n.startswith("dequantize_") for n in names) and any("_f16a_" in n for n in names), names
    assert not grid_faults(plan, ctx)
    deq = next(ln for ln in plan.launches if ln.fn.name.startswith("dequantize_"))
    plan.launches[:] = [ln._replace(grid=deq.grid) if "_f16a_" in ln.fn.name else ln for ln in plan.launches]
    assert any("persistent CTAs" in f for f in grid_faults(plan, ctx))
