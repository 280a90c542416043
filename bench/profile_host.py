"""Where an op's host time goes (cProfile): N calls of mul_mat(w, x, out=y) on torch CUDA tensors for each format and
T given (or mul_mat_id(w, x, ids, out=y) for a case `id:E:top:fmt:T`), after a warm-up, weights rotated; prints the
µs per call without and under cProfile and the functions that take it.
Usage: profile_host.py MxK case,case,... [N] (e.g. 4096x14336 tq4_1s:1,q4_K:1,q4_K:4096 200;
768x2048 id:128:8:q4_K:1)."""
import cProfile
import pstats
import sys
import time

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import random_raw, weight_copies

m, k = (int(v) for v in sys.argv[1].split("x"))
n = int(sys.argv[3]) if len(sys.argv) > 3 else 200
rng = np.random.default_rng(0)
for case in sys.argv[2].split(","):
    parts = case.split(":")
    if parts[0] == "id":  # mul_mat_id: E experts, top slots a token
        e, top, fmt, t = int(parts[1]), int(parts[2]), parts[3], int(parts[4])
        raw = random_raw(fmt, e * m, k, rng)
        ws = [r.QuantTensor.from_raw(fmt, raw, (e, m, k)).to_device() for _ in range(2)]
        ids = torch.as_tensor(np.stack([rng.choice(e, top, replace=False) for _ in range(t)]).astype(np.int32),
                              device="cuda")
        x = torch.randn(t, k, device="cuda", dtype=torch.float32)
        y = torch.empty(t, top, m, device="cuda", dtype=torch.float32)
        call = lambda i: r.mul_mat_id(ws[i % len(ws)], x, ids, out=y)  # noqa: E731
        what = f"mul_mat_id {e}x{m}x{k} top-{top}"
    else:
        fmt, t = parts[0], int(parts[1])
        raw = random_raw(fmt, m, k, rng)
        ws = weight_copies(r, fmt, raw, m, k)
        x = torch.randn(t, k, device="cuda", dtype=torch.float32)
        y = torch.empty(t, m, device="cuda", dtype=torch.float32)
        call = lambda i: r.mul_mat(ws[i % len(ws)], x, out=y)  # noqa: E731
        what = f"mul_mat {m}x{k}"
    for i in range(5):
        call(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        call(i)
    plain = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i in range(n):
        call(i)
    prof.disable()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    print(f"== {fmt} {what} T={t}: {plain:.1f} µs host per call ({host:.0f} under cProfile)")
    pstats.Stats(prof).sort_stats("tottime").print_stats(22)
