"""Probe: whole-op times of mul_mat (exact) for one format over shapes and token counts, e.g. to compare kernel
variants emitted into PTXGEN_EMITTED_DIR: probe_gemv_times.py FMT MxK,MxK,... T,T,... [reps]. Checks each shape
against the float64 reference (1e-5) first. bench_gemv's timing (weights from HBM)."""

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_weights, timed
from ptxgen import formats

fmt, shapes, tokens, reps = probe_argv(60)
for m, k, raw, ws in probe_weights(r, fmt, shapes):
    copies = len(ws)
    out = []
    for t in tokens:
        x = torch.randn(t, k, device="cuda", dtype=torch.float32)
        y = torch.empty(t, m, device="cuda", dtype=torch.float32)
        xs = x.cpu().numpy()
        ref = formats.gemv_tq4_1s_ref(raw, m, k, xs) if fmt == "tq4_1s" else formats.gemm_ref(fmt, raw, m, k, xs)
        err = np.linalg.norm(r.mul_mat(ws[0], xs) - ref) / np.linalg.norm(ref)
        assert err <= 1e-5, f"{fmt} {m}x{k} T={t}: relative error {err:.2e}"
        out.append(f"T={t} {timed(lambda i: r.mul_mat(ws[i % copies], x, out=y), reps, torch):.1f}")
    print(f"{fmt} {m}x{k}: " + ", ".join(out) + " us", flush=True)
