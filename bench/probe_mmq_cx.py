"""Probe: the sm_90a register-A MMQ converting fp32 x inside the launch (mmq_launch path "wgmma_ra_cx": the
producer warpgroup's idle warps write the fp16 copy chunk by chunk, the TMA thread waits on x_ready counters) against
convert_f16_perm + the same GEMM ("wgmma_ra_x16"), same run, same inputs: bits equal asserted, then bench_mmq's
timing (the whole op through mmq_launch, weights rotated past the L2). Usage: probe_mmq_cx.py MxK,... T,... [reps]."""

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, zeroed_flag, probe_cases, timed
from ptxgen.runtime import ops

shapes, tokens, reps = probe_argv(30, lead=0)
flag = zeroed_flag(r)
print("| M×K | T | splits | convert_f16_perm + GEMM µs | GEMM converting x µs | ratio |")
print("|---|---|---|---|---|---|")
for m, k, raw, ws, t, x, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    got = {}
    bn = 128 if t <= 128 else 256  # the converting builds' tiles (n64 has none)
    for path in ("wgmma_ra_x16", "wgmma_ra_cx"):
        y.fill_(float("nan"))
        ops.mmq_launch(ws[0], xa, ya, t, flag, bn=bn, path=path)
        got[path] = y.cpu().numpy()
    assert np.isfinite(got["wgmma_ra_cx"]).all(), (m, k, t)
    assert np.array_equal(got["wgmma_ra_cx"].view(np.uint32), got["wgmma_ra_x16"].view(np.uint32)), (m, k, t)
    plan = ops.mmq_plan(r.load(f"mmq_q4_k_wgmma_ra_n{bn}", arch="sm_90a"), m, k, t, bn, False, r.current().sm_count)
    us = {p: timed(lambda i, p=p: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, bn=bn, path=p), reps, torch)
          for p in ("wgmma_ra_x16", "wgmma_ra_cx")}
    print(f"| {m}×{k} | {t} | {plan.splits} | {us['wgmma_ra_x16']:.1f} | {us['wgmma_ra_cx']:.1f} | "
          f"{us['wgmma_ra_x16'] / us['wgmma_ra_cx']:.3f}x |", flush=True)
