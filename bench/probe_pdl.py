"""Probe: a decode op with and without programmatic dependent launch (every launch of the op), and for Q4_K the
sm_89 build of the same kernels: probe_pdl.py FMT M K T [reps] (FMT q4_K or tq4_1s, exact mode). Whole op
(preps + GEMV), bench_gemv's timing, weights from HBM."""
import sys

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import random_raw, timed, weight_copies
from ptxgen import formats
from ptxgen.runtime import driver

fmt = sys.argv[1]
m, k, t = (int(v) for v in sys.argv[2:5])
reps = int(sys.argv[5]) if len(sys.argv) > 5 else 60
rng = np.random.default_rng(0)
raw = random_raw(fmt, m, k, rng)
ws = weight_copies(r, fmt, raw, m, k)
copies = len(ws)
x = torch.randn(t, k, device="cuda", dtype=torch.float32)
y = torch.empty(t, m, device="cuda", dtype=torch.float32)
xs = x.cpu().numpy()
ref = formats.gemv_tq4_1s_ref(raw, m, k, xs) if fmt == "tq4_1s" else formats.gemm_ref(fmt, raw, m, k, xs)
launch = driver.Function.launch


def no_pdl(self, *a, **kw):
    kw["pdl"] = False
    return launch(self, *a, **kw)


variants = [("pdl (default)", None, launch), ("no pdl", None, no_pdl)]
if fmt == "q4_K":
    variants.append(("sm_89 build", "sm_89", launch))
for label, arch, fn in variants:
    driver.Function.launch = fn
    err = np.linalg.norm(r.mul_mat(ws[0], xs, arch=arch) - ref) / np.linalg.norm(ref)
    us = timed(lambda i: r.mul_mat(ws[i % copies], x, out=y, arch=arch), reps, torch)
    print(f"{fmt} {m}x{k} T={t} {label}: {us:.1f} us (rel err {err:.1e})", flush=True)
driver.Function.launch = launch
