"""Probe: Q4_K at T = 9-16 (#6's T=16 column) — mul_mat with PTXGEN_MMQ_SKINNY=0 (prep_q4k_t16h +
gemv_q4_k_mma_t16h, each warp copying the 16-token records into its own ring: 4 warps per SM), mul_mat's default
(since session 18 the skinny GEMM below where t16h's grid takes two rounds) and the register-A skinny GEMM built for
16-token groups (mmq_q4_k_rega_n16: the same records shared by the CTA's warps, one CTA barrier per step), in ring
plans S,C,MT,NW (stages, CTAs per SM, m16 tiles per warp, warps; `cur` = gemv_t1.SKINNY_PLAN's n16 plan: 3,2,2,4
in probe_skinny16_session18.log, 2,3,2,4 since), built from the DSL here. Each within 1e-3 of the float64 reference. Usage: probe_skinny16.py PLAN/PLAN/... MxK,... T,... [reps]."""
import os

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_cases, timed
from ptxgen import formats
from ptxgen.kernels import KERNELS, KernelDef, gemv_t1
from ptxgen.runtime import kernels, ops

what, shapes, tokens, reps = probe_argv(40)
plans = what.split("/")
load = kernels.load
for i, plan in enumerate(plans):
    p = None if plan == "cur" else tuple(int(v) for v in plan.split(","))
    KERNELS[f"probe_{i}"] = KernelDef(f"probe_{i}", "probe", lambda arch, p=p: gemv_t1.build_skinny(arch, 16, p),
                                      archs=("sm_90a",))


def plan_load(i):
    def f(kname, *a, **kw):
        return load(f"probe_{i}", *a, source="dsl") if kname == "mmq_q4_k_rega_n16" else load(kname, *a, **kw)
    return f


for m, k, raw, ws, t, xt, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    ref = formats.gemm_ref("q4_K", raw, m, k, xt.cpu().numpy())
    xa, ya = r.as_device_array(xt), r.as_device_array(y)

    def check(fn, what):
        y.fill_(float("nan"))
        fn(0)
        got = y.cpu().numpy()
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err <= 1e-3, (what, m, k, t, err)

    row = []
    fn = lambda i: r.mul_mat(ws[i % len(ws)], xt, out=y)
    os.environ["PTXGEN_MMQ_SKINNY"] = "0"
    check(fn, "t16h")
    row.append(f"t16h {timed(fn, reps, torch):.1f}")
    del os.environ["PTXGEN_MMQ_SKINNY"]
    check(fn, "mul_mat")
    row.append(f"mul_mat {timed(fn, reps, torch):.1f}")
    for i, plan in enumerate(plans):
        kernels.load = plan_load(i)
        fn = lambda i: ops._skinny_gemm(ws[i % len(ws)], xa.ptr, ya.ptr, m, k, t, "sm_90a", c=16)
        check(fn, plan)
        row.append(f"n16 {plan} {timed(fn, reps, torch):.1f}")
        kernels.load = load
    print(f"q4_K {m}x{k} T={t}: " + ", ".join(row) + " us", flush=True)
