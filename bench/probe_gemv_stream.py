"""Probe (#7): decode GEMVs one launch at a time (bench_gemv's timing: a sleep, then events around one op) against
the same ops back to back, as a model's decode runs layer after layer — N ops issued behind one long sleep, each on
the next copy of the weights (the copies pass 4x the 60 MB L2, so every op reads its weights from HBM), events
around all N: µs per op and % of the 4.27 TB/s copy bandwidth in both. The read floor (probe_read_floor's CuPy
kernel: 16-byte streaming loads, nothing else) is timed both ways on the same byte counts, for the ceiling of
each timing. Every op's result is checked against the float64 reference first (relative error ≤ 1e-5, exact mode).
Usage: probe_gemv_stream.py MxK,... [N] [fmt,fmt] (default 18944x3584,3584x18944,4096x14336,14336x4096 40
tq4_1s,q4_K)."""
import math
import sys
import time

import cupy as cp
import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import HBM, random_raw, timed, weight_copies
from probe_read_floor import SRC
from ptxgen import formats

a = sys.argv[1:]
shapes = [tuple(int(v) for v in s.split("x")) for s in (a[0] if a else "18944x3584,3584x18944,4096x14336,14336x4096").split(",")]
N = int(a[1]) if len(a) > 1 else 40
fmts = (a[2] if len(a) > 2 else "tq4_1s,q4_K").split(",")


def stream(fn, n, sleep_cycles=100_000_000):
    """n calls of fn(i) back to back behind one sleep long enough for Python to enqueue them all: (device µs per
    call, host µs per call to enqueue it)."""
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(sleep_cycles)
    t0 = time.perf_counter()
    s.record()
    for i in range(n):
        fn(i)
    e.record()
    host = time.perf_counter() - t0
    e.synchronize()
    gpu = s.elapsed_time(e) * 1e3
    assert host * 1e6 < 0.8 * sleep_cycles / 1.98e3, f"enqueue took {host * 1e3:.1f} ms: the sleep did not cover it"
    return gpu / n, host * 1e6 / n


kern = cp.RawKernel(SRC, "read16")
sms = torch.cuda.get_device_properties(0).multi_processor_count
out = cp.zeros(sms * 64, dtype=cp.uint32)
rng = np.random.default_rng(0)
print("| M×K | format | weight MB | one op µs (% HBM) | back to back µs per op (% HBM) | read floor, one launch µs (%) "
      "| read floor, back to back µs (%) | host µs to enqueue one op |")
print("|---|---|---|---|---|---|---|---|")
for m, k in shapes:
    for fmt in fmts:
        raw = random_raw(fmt, m, k, rng)
        ws = weight_copies(r, fmt, raw, m, k)
        nb = raw.nbytes
        x = torch.randn(1, k, device="cuda", dtype=torch.float32)
        y = torch.empty(1, m, device="cuda", dtype=torch.float32)
        xs = x.cpu().numpy()
        ref = formats.gemv_tq4_1s_ref(raw, m, k, xs) if fmt == "tq4_1s" else formats.gemm_ref(fmt, raw, m, k, xs)
        for w in ws[:2]:
            err = np.linalg.norm(r.mul_mat(w, xs) - ref) / np.linalg.norm(ref)
            assert err <= 1e-5, f"{fmt} {m}x{k}: relative error {err:.2e}"
        op = lambda i: r.mul_mat(ws[i % len(ws)], x, out=y)  # noqa: E731
        one = timed(op, 40, torch)
        runs = [stream(op, N) for _ in range(3)]
        seq, host = (float(np.median([v[i] for v in runs])) for i in range(2))
        copies = max(2, math.ceil(4 * 60e6 / nb))
        bufs = [torch.empty(nb // 4, device="cuda").uniform_() for _ in range(copies)]
        cs = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        rd = lambda i: kern((sms * 8,), (256,), (cp.uint64(bufs[i % copies].data_ptr()), cp.uint64(nb // 16), out),  # noqa: E731
                            stream=cs)
        rd(0)
        f1 = timed(rd, 40, torch)
        fs = float(np.median([stream(rd, N)[0] for _ in range(3)]))
        pct = lambda us: f"{us:.1f} ({nb / (us * 1e-6) / HBM:.0%})"  # noqa: E731
        print(f"| {m}×{k} | {fmt} | {nb / 1e6:.1f} | {pct(one)} | {pct(seq)} | {pct(f1)} | {pct(fs)} | {host:.0f} |", flush=True)
