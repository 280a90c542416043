"""One mul_mat on the f16a route (rule mmq_f16a, the prepared route forced from T = 1), a few calls, for ncu:
    ncu --kernel-name regex:f16a python3 bench/probe_f16a.py q8_0 4096 14336 4096 float32
Compares the GEMM converting an fp32 x itself (mmq_q4_k_wgmma_f16a_n256_cx) with the one on fp16 x."""
import sys

import numpy as np
import torch

import ptxgen.runtime as r
from ptxgen import tuning
from ptxgen.testing.strategies import random_raw

fmt, m, k, t, dt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
w = r.QuantTensor.from_raw(fmt, random_raw(fmt, m, k, np.random.default_rng(0)), (m, k)).to_device()
x = torch.randn(t, k, device="cuda", dtype=getattr(torch, dt))
y = torch.empty(t, m, device="cuda")
rules = dict(mmq_f16a=True, mmq_pre_min_tokens=1, codec_ra_mmq_max_tokens={f: 8 for f in ("q5_K", "q6_K", "q8_0", "tq4_1s")})
with tuning.override(**rules):
    print(r.mul_mat_plan(w, t, x_dtype=dt).kernels, flush=True)
    for _ in range(4):
        r.mul_mat(w, x, out=y)
    torch.cuda.synchronize()
