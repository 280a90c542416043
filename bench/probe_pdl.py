"""Probe: the Q4_K tensor-core GEMVs with and without programmatic dependent launch, and the sm_89 build of
the same kernel, on one shape: probe_pdl.py M K T [reps]. Whole op (preps + GEMV), bench_gemv's timing."""
import math
import sys

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import random_raw, timed
from ptxgen import formats
from ptxgen.runtime import kernels

m, k, t = (int(v) for v in sys.argv[1:4])
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 60
rng = np.random.default_rng(0)
raw = random_raw("q4_K", m, k, rng)
copies = max(2, math.ceil(4 * 60e6 / (m * formats.get("q4_K").row_bytes(k))))
ws = [r.QuantTensor.from_raw("q4_K", raw, (m, k)) for _ in range(copies)]
x = torch.randn(t, k, device="cuda", dtype=torch.float32)
y = torch.empty(t, m, device="cuda", dtype=torch.float32)
name = "gemv_q4_k_mma" if t <= 8 else "gemv_q4_k_mma_n16"
ref = formats.gemm_ref("q4_K", raw, m, k, x.cpu().numpy())
for label, arch, pdl in (("sm_90a, pdl", None, True), ("sm_90a, no pdl", None, False), ("sm_89", "sm_89", None)):
    fn = kernels.load(name, arch)
    if pdl is not None:
        fn.meta["pdl"] = pdl and fn.arch == "sm_90a"
    got = r.mul_mat(ws[0], x.cpu().numpy(), arch=arch)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    us = timed(lambda i: r.mul_mat(ws[i % copies], x, out=y, arch=arch), reps, torch)
    print(f"{name} {m}x{k} T={t} {label}: {us:.1f} us (rel err {err:.1e}, copy {fn.meta.get('copy')})", flush=True)
