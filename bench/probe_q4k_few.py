"""Probe: Q4_K few-token builds against what mul_mat ran before them, same run, bench_gemv's timing (weights from
HBM): probe_q4k_few.py MxK,MxK,... T,T,... [reps]. T ≤ 8: gemv_q4_k_mma (the default above 4 tokens) vs
gemv_q4_k_mma_t8 (ops.RULES.q4k_few_max_tokens raised to 8); T = 9-16: the exact gemv_q4_k_mma_n16 vs
gemv_q4_k_mma_t16h (PTXGEN_Q4K_T16H=0 / 1). Each variant is checked against the
float64 reference first (1e-5; t16h 1e-3) and its relative error printed."""

import os

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_weights, timed
from ptxgen import formats, tuning
from ptxgen.runtime import ops

_, shapes, tokens, reps = probe_argv(60)


def variants(t):
    if t <= 8:
        return {"mma": ({}, 4, 1e-5), "t8": ({}, 8, 1e-5)}
    # (the MMQ is not timed here: mul_mat on an MMQ path reads its overflow flag back, a host sync; bench_mmq
    # times the MMQ launches)
    return {"n16": ({"PTXGEN_Q4K_T16H": "0"}, 4, 1e-5), "t16h": ({"PTXGEN_Q4K_T16H": "1"}, 4, 1e-3)}


for m, k, raw, ws in probe_weights(r, "q4_K", shapes):
    copies = len(ws)
    for t in tokens:
        x = torch.randn(t, k, device="cuda", dtype=torch.float32)
        y = torch.empty(t, m, device="cuda", dtype=torch.float32)
        xs = x.cpu().numpy()
        ref = formats.gemm_ref("q4_K", raw, m, k, xs)
        out = []
        for name, (env, few, bar) in variants(t).items():
            os.environ.update(env)
            tuning.set(q4k_few_max_tokens=few)
            err = np.linalg.norm(r.mul_mat(ws[0], xs) - ref) / np.linalg.norm(ref)
            assert err <= bar, f"{name} {m}x{k} T={t}: relative error {err:.2e}"
            us = timed(lambda i: r.mul_mat(ws[i % copies], x, out=y), reps, torch)
            out.append(f"{name} {us:.1f} (err {err:.1e})")
            for v in env:
                del os.environ[v]
        print(f"q4_K {m}x{k} T={t}: " + ", ".join(out) + " us", flush=True)
