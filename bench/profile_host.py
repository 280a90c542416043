"""Where mul_mat's host time goes (cProfile): N calls of mul_mat(w, x, out=y) on device arrays for each format and T
given, after a warm-up, weights rotated; prints the µs per call and the functions that take it.
Usage: profile_host.py MxK fmt:T,fmt:T,... [N] (e.g. 4096x14336 tq4_1s:1,q4_K:1,q4_K:4096 200)."""
import cProfile
import pstats
import sys
import time

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import random_raw, weight_copies

m, k = (int(v) for v in sys.argv[1].split("x"))
cases = [(c.split(":")[0], int(c.split(":")[1])) for c in sys.argv[2].split(",")]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 200
rng = np.random.default_rng(0)
for fmt, t in cases:
    raw = random_raw(fmt, m, k, rng)
    ws = weight_copies(r, fmt, raw, m, k)
    x = torch.randn(t, k, device="cuda", dtype=torch.float32)
    y = torch.empty(t, m, device="cuda", dtype=torch.float32)
    for i in range(5):
        r.mul_mat(ws[i % len(ws)], x, out=y)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i in range(n):
        r.mul_mat(ws[i % len(ws)], x, out=y)
    prof.disable()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    print(f"== {fmt} {m}x{k} T={t}: {host:.0f} µs host per call (under cProfile)")
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)
