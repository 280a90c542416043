"""Probe: where the converting register-A MMQ's time goes (mmq_q4_k_wgmma_ra_n*_cx against convert_f16_perm +
mmq_q4_k_wgmma_ra_n*). Per shape and T, µs with bench_gemv's timing through mmq_launch (weights rotated past the L2):
x16 = the op after convert_f16_perm, and its two kernels' device times (CUPTI); cx = the converting op; cx, no wait =
its PTX with the TMA thread's x_ready spin removed (wrong results where a chunk comes late: timing only); cx, GEMM alone
= no wait and the converter warps returning at once (x16 unconverted: the GEMM alone in the converting build's item
order, m fastest). Usage: probe_mmq_cx_parts.py MxK,... T,... [reps]."""
import re
from collections import defaultdict

import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_cases, ptx_function, timed, zeroed_flag
from ptxgen.runtime import kernels, ops

shapes, tokens, reps = probe_argv(20, lead=0)
flag = zeroed_flag(r)


def mutated(name, wait_off, conv_off):
    text, entry = kernels.ptx_source(name, "sm_90a")
    if wait_off:
        text, n = re.subn(r"\n\s*@%p\d+ bra \$L_x_spin_\d+;", "\n", text)
        assert n == 1
    if conv_off:
        text, n = re.subn(r"(\n\s*@%p\d+ bra\.uni \$L_producer_\d+;)", r"\1\n\tret;", text)
        assert n == 1
    return ptx_function(r, text, entry, "sm_90a")


print("| M×K | T | x16 op µs | convert_f16_perm µs | GEMM µs | cx op µs | cx, no wait µs | cx, GEMM alone µs |")
print("|---|---|---|---|---|---|---|---|")
for m, k, raw, ws, t, x, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    bn = 128 if t <= 128 else 256  # the converting builds' tiles (n64 has none)
    name = f"mmq_q4_k_wgmma_ra_n{bn}_cx"
    real = kernels.load(name, "sm_90a")

    def op(path):
        return timed(lambda i: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, bn=bn, path=path), reps, torch)
    x16 = op("wgmma_ra_x16")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            torch.cuda._sleep(1_000_000)
            ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, bn=bn, path="wgmma_ra_x16")
        torch.cuda.synchronize()
    per = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and "sleep" not in ev.name:
            per[ev.name] += ev.device_time / reps
    conv = sum(v for n_, v in per.items() if "convert" in n_)
    gemm = sum(v for n_, v in per.items() if "mmq" in n_)
    cx = op("wgmma_ra_cx")
    cells = []
    for wait_off, conv_off in ((True, False), (True, True)):
        kernels._BEST[(name, "sm_90a", "emitted")] = mutated(name, wait_off, conv_off)
        cells.append(op("wgmma_ra_cx"))
    kernels._BEST[(name, "sm_90a", "emitted")] = real
    flag.owner.fill_bytes(0)
    print(f"| {m}×{k} | {t} | {x16:.1f} | {conv:.1f} | {gemm:.1f} | {cx:.1f} | {cells[0]:.1f} | {cells[1]:.1f} |",
          flush=True)
