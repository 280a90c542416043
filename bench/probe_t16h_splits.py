"""Probe: gemv_q4_k_mma_t16h's K splits (sm_89 and sm_90a builds): mul_mat(arch=...) at T=16 with gemv_splits pinned
(auto = the runtime's rule). Usage: probe_t16h_splits.py - MxK,... T,... [reps]."""
import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_cases, timed
from ptxgen import formats
from ptxgen.runtime import ops

_, shapes, tokens, reps = probe_argv(40)
orig = ops.gemv_splits


def pinned(s):  # gemv_splits returning s (within the K-steps and the build's max)
    return lambda ctas, k, per_sm, sms, lane_cols=32, max_splits=8, min_steps=1: min(s, max_splits, -(-(k // lane_cols) // 32))


for m, k, raw, ws, t, xt, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    x = xt.cpu().numpy()
    ref = formats.gemm_ref("q4_K", raw, m, k, x)
    for arch in ("sm_89", None):
        row = []
        for s in (None, 1, 2, 4, 8, 16):
            ops.gemv_splits = orig if s is None else pinned(s)
            err = np.linalg.norm(r.mul_mat(ws[0], x, arch=arch) - ref) / np.linalg.norm(ref)
            assert err <= 1e-3, (arch, s, err)
            us = timed(lambda i: r.mul_mat(ws[i % len(ws)], xt, out=y, arch=arch), reps, torch)
            row.append(f"{'auto' if s is None else s}: {us:.1f}")
        ops.gemv_splits = orig
        print(f"{m}x{k} T={t} {arch or 'sm_90a'}: " + ", ".join(row) + " us", flush=True)
