"""Probe: the codec GEMVs (gemv_<fmt>_f32_t1 / _t2, 4096x14336) launched back to back over 24 weights with and
without programmatic dependent launch (the runtime launches them with PDL: they wait at their head). On the H200
(bench/results/probe_pdl_gemv_2026-12-01.log) Q8_0 at T = 1 ran 28.7 µs without PDL and 41.9 with it while its
trigger sat at the kernel's head; with the trigger after the K loop, 32.6. Usage (from the repository root): python3 bench/probe_pdl_gemv.py"""
import sys; sys.path.insert(0, "bench")
import torch, numpy as np, ptxgen.runtime as r
from bench_op import eager
from ptxgen.testing.strategies import random_raw
m, k = 4096, 14336
for fmt in ("q8_0", "q6_K", "q5_K"):
    raw = random_raw(fmt, m, k, np.random.default_rng(0))
    tw = [torch.from_numpy(raw.reshape(-1)).cuda() for _ in range(24)]
    for t in (1, 2):
        x = torch.randn(t, k, device="cuda"); ys = [torch.empty(t, m, device="cuda") for _ in range(24)]
        fn = r.kernels.load(f"gemv_{fmt.lower()}_f32_t{t}")
        g = (-(-m // int(fn.meta["rows_per_cta"])),)
        s = torch.cuda.current_stream().cuda_stream
        res = [eager(torch, lambda i: fn.launch(g, (tw[i % 24].data_ptr(), x.data_ptr(), ys[i % 24].data_ptr(), m, k, t), stream=s, pdl=p), calls=96, rounds=5) for p in (False, True)]
        print(f"{fmt} T={t} grid {g}: no PDL {res[0]:.1f}  PDL {res[1]:.1f}", flush=True)
