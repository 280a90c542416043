"""Probe: ring plans of the few-token Q4_K tensor-core kernels (gemv_q4_k_mma_t{1,2,4,8}, t16h) side by side through
mul_mat, built from the DSL here (sm_90a): a plan is S,C,MT,SB = ring stages, resident CTAs per SM, m16 tiles per
warp, super-blocks per ring step (gemv_t1.T1_PLAN / T1_STEP); `cur` is the shipped plan. Each build within the
op's bar of the float64 reference (1e-5 exact, 1e-3 t16h). Usage: probe_q4k_ring_step.py SFX:PLAN/PLAN/...
MxK,... T,... [reps], e.g. t1:cur/2,4,1,2 4096x14336 1."""
import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_cases, timed
from ptxgen import formats
from ptxgen.kernels import KERNELS, KernelDef, gemv_t1
from ptxgen.runtime import kernels

what, shapes, tokens, reps = probe_argv(40)
sfx, plans = what.split(":")
plans = plans.split("/")
nt, hi_only = int(sfx[1:].rstrip("h")), sfx.endswith("h")
name = f"gemv_q4_k_mma_{sfx}"
load = kernels.load


def plan_build(plan):
    def build(arch):
        if plan == "cur":
            return gemv_t1.build(arch, nt, hi_only)
        S, C, MT, SB = (int(v) for v in plan.split(","))
        saved, saved_step = dict(gemv_t1.T1_PLAN["big"]), dict(gemv_t1.T1_STEP)
        gemv_t1.T1_PLAN["big"][sfx] = (S, C, MT)
        gemv_t1.T1_STEP[("big", sfx)] = SB
        try:
            return gemv_t1.build(arch, nt, hi_only)
        finally:
            gemv_t1.T1_PLAN["big"].clear()
            gemv_t1.T1_PLAN["big"].update(saved)
            gemv_t1.T1_STEP.clear()
            gemv_t1.T1_STEP.update(saved_step)
    return build


for i, plan in enumerate(plans):
    KERNELS[f"probe_{i}"] = KernelDef(f"probe_{i}", "probe", plan_build(plan), archs=("sm_90a",))


def plan_load(i):
    def f(kname, *a, **kw):
        return load(f"probe_{i}", *a, source="dsl") if kname == name else load(kname, *a, **kw)
    return f


bar = 1e-3 if hi_only else 1e-5
for m, k, raw, ws, t, xt, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    ref = formats.gemm_ref("q4_K", raw, m, k, xt.cpu().numpy())
    row = []
    for i, plan in enumerate(plans):
        kernels.load = plan_load(i)
        y.fill_(float("nan"))
        r.mul_mat(ws[0], xt, out=y)
        got = y.cpu().numpy()
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err <= bar, (plan, m, k, t, err)
        us = timed(lambda i: r.mul_mat(ws[i % len(ws)], xt, out=y), reps, torch)
        row.append(f"{plan} {us:.1f}")
    kernels.load = load
    print(f"q4_K {m}x{k} T={t} {sfx}: " + ", ".join(row) + " us", flush=True)
