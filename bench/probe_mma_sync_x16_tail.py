"""Probe: fused vs x16 mma.sync MMQ (e.g. at token counts with a partial last token tile); checks each against float64.
Usage: probe_mma_sync_x16_tail.py - MxK,... T,... [reps]."""
import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_weights, timed
from ptxgen import formats
from ptxgen.runtime.ops import mmq_launch

_, shapes, tokens, reps = probe_argv(30)
flag = r.DeviceArray.empty((1,), np.uint32)
for m, k, raw, ws in probe_weights(r, "q4_K", shapes):
    copies = len(ws)
    for t in tokens:
        x = torch.randn(t, k, device="cuda", dtype=torch.float32)
        y = torch.empty(t, m, device="cuda", dtype=torch.float32)
        xa, ya = r.as_device_array(x), r.as_device_array(y)
        ref = formats.gemm_ref("q4_K", raw, m, k, x.cpu().numpy())
        row = {}
        for path in ("mma.sync", "mma.sync_x16"):
            y.fill_(float("nan"))
            mmq_launch(ws[0], xa, ya, t, flag, path=path, arch="sm_89")
            got = y.cpu().numpy()
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            assert err <= 1e-3, (path, t, err)
            row[path] = timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag, path=path, arch="sm_89"), reps, torch)
        print(f"{m}x{k} T={t}: " + ", ".join(f"{a} {v:.1f}" for a, v in row.items()) + " us", flush=True)
