"""Probe: a 64-token register-A wgmma MMQ (mmq_q4_k_wgmma_ra_n64, built in-process from MmqSpec(64, a_regs=True):
not emitted) against the n128 build mul_mat runs at T = 49-128 and against mul_mat's default, same run, whole op
through mmq_launch (convert_f16_perm + GEMM; weights rotated past the L2). At T ≤ 64 the n128 tile multiplies 64+
padding tokens; n64 halves the tensor work per step, the dequant stays. Each result within 1e-3 of the n128 one.
The mul_mat column includes the op's overflow-flag readback (a host sync), unlike bench_mmq's ptxgen column; the
last column is the shared-memory-A wgmma n64 build mul_mat runs at T = 33-48 (added after the session-19 log).
Usage: probe_rega_n64.py MxK,... T,... [reps]."""

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_cases, ptx_function, timed, zeroed_flag
from ptxgen.arch import get_arch
from ptxgen.kernels.mmq import MmqSpec, build
from ptxgen.runtime import kernels, ops

shapes, tokens, reps = probe_argv(30, lead=0)
k64 = build(get_arch("sm_90a"), MmqSpec(64, "wgmma", a_regs=True))
text = k64.ptx()
entry = k64.manifest(text)
kernels._BEST[(k64.name, "sm_90a", "emitted")] = ptx_function(r, text, entry, "sm_90a")
flag = zeroed_flag(r)
print("| M×K | T | mul_mat µs | RA n128 µs (splits) | RA n64 µs (splits) | n128 / n64 | A from shared memory, n64 µs |")
print("|---|---|---|---|---|---|---|")
for m, k, raw, ws, t, x, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    got, us, sp = {}, {}, {}
    for bn in (128, 64):
        y.fill_(float("nan"))
        ops.mmq_launch(ws[0], xa, ya, t, flag, bn=bn, path="wgmma_ra_x16")
        got[bn] = y.cpu().numpy()
        sp[bn] = ops.mmq_plan(kernels.load(f"mmq_q4_k_wgmma_ra_n{bn}", "sm_90a"), m, k, t, bn, False,
                              r.current().sm_count).splits
        us[bn] = timed(lambda i, bn=bn: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, bn=bn, path="wgmma_ra_x16"),
                       reps, torch)
    assert np.isfinite(got[64]).all(), (m, k, t)
    err = float(np.linalg.norm(got[64] - got[128]) / np.linalg.norm(got[128]))
    assert err < 1e-3, (m, k, t, err)
    mm = timed(lambda i: r.mul_mat(ws[i % len(ws)], x, out=y), reps, torch)
    smem = timed(lambda i: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, bn=64, path="wgmma"), reps, torch)
    print(f"| {m}×{k} | {t} | {mm:.1f} | {us[128]:.1f} ({sp[128]}) | {us[64]:.1f} ({sp[64]}) | "
          f"{us[128] / us[64]:.3f}x | {smem:.1f} |", flush=True)
