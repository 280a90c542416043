"""Probe: what the activation prep costs the few-token Q4_K ops (prep_q4k_t{nt} + gemv_q4_k_mma_t{nt}, nt = 1 or
16h) — the op as mul_mat runs it; the same launches with the prep replaced by an empty kernel (one CTA that only
lets the GEMV launch: what a free prep would leave, results wrong); the GEMV alone on records prepared once
(no prep launch at all). bench_gemv's timing, weights from HBM. Usage: probe_prep_cost.py MxK,... T,... [reps]"""
import sys

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_cases, timed
from ptxgen import formats
from ptxgen.builder import KernelBuilder
from ptxgen.kernels import KERNELS, KernelDef
from ptxgen.runtime import kernels, ops
from ptxgen.formats import tq4_1s as T4


def empty_prep(arch):
    b = KernelBuilder("probe_empty_prep", arch, "no work: lets the dependent launch go", block=(256, 1, 1))
    for name, kind in (("x", "ptr:in"), ("records", "ptr:out")):
        b.param(name, "u64", kind)
    b.param("ntok", "u32")
    b.param("k", "u32")
    b.emit("griddepcontrol.launch_dependents")
    b.emit("ret")
    return b.finish()


KERNELS["probe_empty_prep"] = KernelDef("probe_empty_prep", "probe", empty_prep, archs=("sm_90a",))
shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")]
tokens = [int(v) for v in sys.argv[2].split(",")]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 40
for m, k, raw, ws, t, xt, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    hi = t > 8
    nt = 16 if hi else next(v for v in T4.Q4K_RECORD_TOKENS if v >= t)
    sfx = f"t{nt}h" if hi else f"t{nt}"
    xa, ya = r.as_device_array(xt), r.as_device_array(y)
    rec = r.DeviceArray.empty((k // 256 * T4.q4k_record_bytes(nt, hi),), np.uint8)
    prep = kernels.load(f"prep_q4k_{sfx}", "sm_90a")
    empty = kernels.load("probe_empty_prep", "sm_90a", source="dsl")
    fn = kernels.load(f"gemv_q4_k_mma_{sfx}", "sm_90a")
    ctas, splits, part, cnt = ops._gemv_split_plan(fn, m, k, t, fn.resident_per_sm())

    def gemv(i):
        fn.launch((ctas, splits), (ws[i % len(ws)].buffer, rec, ya.ptr, m, k, t, part, cnt), pdl=True)

    def op(i, p=prep, grid=((nt * k // 32 + 7) // 8,)):
        p.launch(grid, (xa.ptr, rec, t, k))
        gemv(i)
    y.fill_(float("nan"))
    op(0)
    got = y.cpu().numpy()
    want = formats.gemm_ref("q4_K", raw, m, k, xt.cpu().numpy())
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= (1e-3 if hi else 1e-5)
    full = timed(op, reps, torch)
    free = timed(lambda i: op(i, empty, (1,)), reps, torch)
    alone = timed(gemv, reps, torch)
    prep_only = timed(lambda i: prep.launch(((nt * k // 32 + 7) // 8,), (xa.ptr, rec, t, k)), reps, torch)
    print(f"q4_K {m}x{k} T={t} ({sfx}): op {full:.1f}, empty prep + GEMV {free:.1f}, GEMV alone {alone:.1f}, "
          f"prep alone {prep_only:.1f} us", flush=True)
