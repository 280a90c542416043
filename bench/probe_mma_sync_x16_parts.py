"""Probe: the x16 path's parts: convert_f16 alone, the x16 GEMM on pre-converted x, the whole x16 op, the fused op.
Usage: probe_mma_sync_x16_parts.py - MxK,... T,... [reps]."""
import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_weights, timed
from ptxgen.runtime import ops
from ptxgen.runtime.ops import mmq_launch

_, shapes, tokens, reps = probe_argv(30)
flag = r.DeviceArray.empty((1,), np.uint32)
orig = ops.convert_f16
for m, k, raw, ws in probe_weights(r, "q4_K", shapes):
    copies = len(ws)
    for t in tokens:
        x = torch.randn(t, k, device="cuda", dtype=torch.float32)
        y = torch.empty(t, m, device="cuda", dtype=torch.float32)
        xa, ya = r.as_device_array(x), r.as_device_array(y)
        pre = orig(xa, flag, arch="sm_89")
        row = {}
        row["fused"] = timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag, path="mma.sync", arch="sm_89"), reps, torch)
        row["x16 op"] = timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag, path="mma.sync_x16", arch="sm_89"), reps, torch)
        row["convert"] = timed(lambda i: orig(xa, flag, out=pre, arch="sm_89"), reps, torch)
        ops.convert_f16 = lambda *a, **kw: pre
        row["x16 gemm"] = timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag, path="mma.sync_x16", arch="sm_89"), reps, torch)
        ops.convert_f16 = orig
        print(f"{m}x{k} T={t}: " + ", ".join(f"{a} {v:.1f}" for a, v in row.items()) + " us", flush=True)
