"""Probe: the mma.sync MMQ on fp32 x (fused) against the x16 path (convert_f16, then the GEMM on fp16 x), and the
x16 path's parts: convert_f16 alone and the x16 GEMM on x converted beforehand. Both ops checked against the
float64 reference (1e-3) at every T, e.g. at token counts with a partial last token tile.
Usage: probe_mma_sync_x16.py - MxK,... T,... [reps]."""
import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import mmq_checked, probe_argv, probe_cases, timed
from ptxgen import formats
from ptxgen.runtime import ops
from ptxgen.runtime.ops import mmq_launch

_, shapes, tokens, reps = probe_argv(30)
flag = r.DeviceArray.empty((1,), np.uint32)
convert = ops.convert_f16
for m, k, raw, ws, t, x, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    ref = formats.gemm_ref("q4_K", raw, m, k, x.cpu().numpy())
    row = {}
    for name, path in (("fused", "mma.sync"), ("x16 op", "mma.sync_x16")):
        mmq_checked(mmq_launch, ws[0], x, y, t, flag, path, ref)
        row[name] = timed(lambda i: mmq_launch(ws[i % len(ws)], xa, ya, t, flag, path=path, arch="sm_89"), reps, torch)
    pre = convert(xa, flag, arch="sm_89")
    row["convert"] = timed(lambda i: convert(xa, flag, out=pre, arch="sm_89"), reps, torch)
    ops.convert_f16 = lambda *a, **kw: pre
    row["x16 gemm"] = timed(lambda i: mmq_launch(ws[i % len(ws)], xa, ya, t, flag, path="mma.sync_x16", arch="sm_89"),
                            reps, torch)
    ops.convert_f16 = convert
    print(f"{m}x{k} T={t}: " + ", ".join(f"{a} {v:.1f}" for a, v in row.items()) + " us", flush=True)
