"""Probe: whole-op times of mul_mat (exact) for one format over shapes and token counts, e.g. to compare kernel
variants emitted into PTXGEN_EMITTED_DIR: probe_gemv_times.py FMT MxK,MxK,... T,T,... [reps]. Checks each shape
against the float64 reference (1e-5) first. bench_gemv's timing (weights from HBM)."""
import math
import sys

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import random_raw, timed
from ptxgen import formats

fmt = sys.argv[1]
shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[2].split(",")]
tokens = [int(v) for v in sys.argv[3].split(",")]
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 60
rng = np.random.default_rng(0)
for m, k in shapes:
    raw = random_raw(fmt, m, k, rng)
    copies = max(2, math.ceil(4 * 60e6 / (m * formats.get(fmt).row_bytes(k))))
    ws = [r.QuantTensor.from_raw(fmt, raw, (m, k)) for _ in range(copies)]
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
