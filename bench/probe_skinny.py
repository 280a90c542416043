"""Probe: the register-A skinny GEMM mmq_q4_k_rega_n32 (sm_90a build and the sm_89 one) against the MMQ this
GPU runs (the wgmma one on sm_90; launches only, no flag readback, as bench_mmq), the mma.sync MMQ and cuBLAS fp16
on dequantized weights, same run, bench_gemv's timing (weights from HBM): probe_skinny.py q4_K MxK,MxK,... T,T,...
[reps]. Each skinny build is checked against the float64 reference first (1e-3)."""

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_weights, timed
from ptxgen import formats
from ptxgen.runtime import ops

_, shapes, tokens, reps = probe_argv(60)
for m, k, raw, ws in probe_weights(r, "q4_K", shapes):
    copies = len(ws)
    w16 = torch.from_numpy(formats.dequantize("q4_K", raw, (m, k)).astype(np.float16)).cuda()
    w16s = [w16.clone() for _ in range(max(2, int(4 * 60e6 / w16.numel() / 2) + 1))]
    flag = r.DeviceArray.empty((1,), np.uint32)
    for t in tokens:
        x = torch.randn(t, k, device="cuda", dtype=torch.float32)
        y = torch.empty(t, m, device="cuda", dtype=torch.float32)
        xs = x.cpu().numpy()
        ref = formats.gemm_ref("q4_K", raw, m, k, xs) if m * t <= 4096 * 64 else None
        xa, ya = r.as_device_array(x), r.as_device_array(y)
        out = []
        for arch in (None, "sm_89"):
            if ref is not None:
                got = r.DeviceArray.empty((t, m), np.float32)
                got.owner.fill_bytes(0xFF)
                ops._skinny_gemm(ws[0], xa.ptr, got.ptr, m, k, t, arch)
                err = np.linalg.norm(got.numpy() - ref) / np.linalg.norm(ref)
                assert err <= 1e-3, f"skinny {arch} {m}x{k} T={t}: relative error {err:.2e}"
            us = timed(lambda i: ops._skinny_gemm(ws[i % copies], xa.ptr, ya.ptr, m, k, t, arch), reps, torch)
            out.append(f"skinny{'' if arch is None else ' ' + arch} {us:.1f}")
        us = timed(lambda i: ops.mmq_launch(ws[i % copies], xa, ya, t, flag), reps, torch)  # no flag readback
        out.append(f"{ops.mmq_path(None, t)} MMQ {us:.1f}")
        us = timed(lambda i: ops.mmq_launch(ws[i % copies], xa, ya, t, flag, path="mma.sync"), reps, torch)
        out.append(f"mma.sync MMQ {us:.1f}")
        xh = x.half()
        us = timed(lambda i: torch.matmul(xh, w16s[i % len(w16s)].t()), reps, torch)
        out.append(f"cuBLAS fp16 {us:.1f}")
        print(f"q4_K {m}x{k} T={t}: " + ", ".join(out) + " us", flush=True)
