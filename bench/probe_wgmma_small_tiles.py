"""Probe: wgmma token tiles below 32 (#6: "token tiles from 8 up, wgmma N = 8...256") against what mul_mat runs at
T <= 16 on sm_90 (the decode GEMVs to T = 8, the mma.sync skinny GEMM gemv_q4_k_mma_t16h at T = 9-16). Built
in-process, not emitted: the shared-memory-A builds mmq_q4_k_wgmma_n8 / _n16 (MmqSpec(8 / 16, "wgmma"); m64n8k16 /
m64n16k16) and the register-A mmq_q4_k_wgmma_ra_n16, beside the emitted smem-A n32 and register-A n64. Whole op
through mmq_launch (convert_f16 / convert_f16_perm + GEMM), weights rotated past the L2; each output checked against
the float64 reference (1e-3) on a NaN-poisoned y first. Usage: probe_wgmma_small_tiles.py MxK,... T,... [reps]."""

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_cases, ptx_function, timed, zeroed_flag
from ptxgen import formats
from ptxgen.arch import get_arch
from ptxgen.kernels.mmq import MmqSpec, build
from ptxgen.runtime import kernels, ops

shapes, tokens, reps = probe_argv(30, lead=0)
for spec in (MmqSpec(8, "wgmma"), MmqSpec(16, "wgmma"), MmqSpec(16, "wgmma", a_regs=True)):
    k_ = build(get_arch("sm_90a"), spec)
    text = k_.ptx()
    kernels._BEST[(k_.name, "sm_90a", "emitted")] = ptx_function(r, text, k_.manifest(text), "sm_90a")
flag = zeroed_flag(r)
CANDIDATES = (("smem-A n8", 8, "wgmma"), ("smem-A n16", 16, "wgmma"), ("smem-A n32", 32, "wgmma"),
              ("RA n16", 16, "wgmma_ra_x16"), ("RA n64", 64, "wgmma_ra_x16"))
print("| M×K | T | mul_mat µs | " + " | ".join(f"wgmma {c[0]} µs (splits)" for c in CANDIDATES) + " |")
print("|---|---|---|" + "---|" * len(CANDIDATES))
for m, k, raw, ws, t, x, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    ref = formats.gemm_ref("q4_K", raw, m, k, x.cpu().numpy())
    cells = []
    for label, bn, path in CANDIDATES:
        if bn < t and bn < 32:
            cells.append("n/a")
            continue
        y.fill_(float("nan"))
        ops.mmq_launch(ws[0], xa, ya, t, flag, bn=bn, path=path)
        got = y.cpu().numpy()
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        assert np.isfinite(got).all() and err < 1e-3, (label, m, k, t, err)
        kind = "ra" if path == "wgmma_ra_x16" else None
        fn = kernels.load(f"mmq_q4_k_wgmma_{kind + '_' if kind else ''}n{bn}", "sm_90a")
        sp = ops.mmq_plan(fn, m, k, t, bn, False, r.current().sm_count).splits
        us = timed(lambda i: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, bn=bn, path=path), reps, torch)
        cells.append(f"{us:.1f} ({sp})")
    y.fill_(float("nan"))
    r.mul_mat(ws[0], x, out=y)
    assert np.linalg.norm(y.cpu().numpy() - ref) < 1e-3 * np.linalg.norm(ref), (m, k, t)
    mm = timed(lambda i: r.mul_mat(ws[i % len(ws)], x, out=y), reps, torch)
    print(f"| {m}×{k} | {t} | {mm:.1f} | " + " | ".join(cells) + " |", flush=True)
