"""Probe: where an op's device time goes, kernel by kernel (CUPTI through torch.profiler): probe_kernel_split.py
FMT MxK,MxK,... T,T,... [reps] (FMT q4_K or tq4_1s; mul_mat's default dispatch, exact mode). Prints each kernel's
mean device µs per op call, their sum, and the op's device time with bench_gemv's timing (the difference is the
gaps between the op's launches). Weights from HBM (rotated copies)."""
from collections import defaultdict

import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_weights, timed

fmt, shapes, tokens, reps = probe_argv(20)
for m, k, raw, ws in probe_weights(r, fmt, shapes):
    copies = len(ws)
    for t in tokens:
        x = torch.randn(t, k, device="cuda", dtype=torch.float32)
        y = torch.empty(t, m, device="cuda", dtype=torch.float32)
        r.mul_mat(ws[0], x, out=y)
        torch.cuda.synchronize()
        op = timed(lambda i: r.mul_mat(ws[i % copies], x, out=y), reps, torch)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for i in range(reps):
                torch.cuda._sleep(1_000_000)
                r.mul_mat(ws[i % copies], x, out=y)
            torch.cuda.synchronize()
        per = defaultdict(float)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA and "sleep" not in ev.name:
                per[ev.name] += ev.device_time / reps  # µs
        parts = ", ".join(f"{n} {v:.1f}" for n, v in per.items())
        print(f"{fmt} {m}x{k} T={t}: op {op:.1f} us; kernels {sum(per.values()):.1f} us = {parts}", flush=True)
