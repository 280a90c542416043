"""Probe: builds of the exact TQ4_1S TMA GEMV (gemv_tq4_1s_tma_t1/t2) side by side through mul_mat — the 16-entry
codebook table (`lut`: one LDS per weight, 4 warps, 3 stages, 4 CTAs per SM) and pair tables (one LDS.64 per qs
byte; variant <copies>w<warps>s<stages>c<CTAs per SM>, e.g. 16w4s2c4 = gemv.TMA_PAIRS) — built from the DSL here;
each within 1e-5 of the float64 reference; Q4_K's exact op on the same shape in the same run (#7: TQ4_1S ≤ 1.15×
Q4_K's time). Usage: probe_tq4_pairs.py VARIANTS MxK,... T,... [reps] (VARIANTS comma-separated, "-" for
lut,32w8s2c2,16w8s3c2,16w4s3c3,16w4s2c4)."""
import re

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_cases, probe_weights, timed
from ptxgen import formats
from ptxgen.kernels import KERNELS, KernelDef, gemv
from ptxgen.runtime import kernels

what, shapes, tokens, reps = probe_argv(40)
variants = ("lut,32w8s2c2,16w8s3c2,16w4s3c3,16w4s2c4" if what == "-" else what).split(",")
load = kernels.load
for v in variants:
    cfg = None if v == "lut" else tuple(int(n) for n in re.fullmatch(r"(\d+)w(\d+)s(\d+)c(\d+)", v).groups())
    for t in (1, 2):
        KERNELS[f"tma_{v}_t{t}"] = KernelDef(f"tma_{v}_t{t}", "probe", lambda arch, t=t, cfg=cfg: gemv.build_tma_lanes(arch, t, cfg),
                                             archs=("sm_90a",))


def variant_load(v):  # the TMA kernel's name -> the variant's build
    def f(name, *a, **kw):
        m = re.fullmatch(r"gemv_tq4_1s_tma_t(\d)", name)
        return load(f"tma_{v}_t{m.group(1)}", *a, source="dsl") if m else load(name, *a, **kw)
    return f


q4k = {(m, k): ws for m, k, _, ws in probe_weights(r, "q4_K", shapes)}
for m, k, raw, ws, t, xt, y in probe_cases(r, torch, "tq4_1s", shapes, tokens):
    ref = formats.gemv_tq4_1s_ref(raw, m, k, xt.cpu().numpy())
    row, bits = [], []
    for name in variants:
        kernels.load = variant_load(name)
        y.fill_(float("nan"))
        r.mul_mat(ws[0], xt, out=y)
        got = y.cpu().numpy()
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err <= 1e-5, (name, m, k, t, err)
        bits.append(got.view(np.uint32).copy())
        us = timed(lambda i: r.mul_mat(ws[i % len(ws)], xt, out=y), reps, torch)
        row.append(f"{name} {us:.1f}")
    kernels.load = load
    same = all(np.array_equal(bits[0], b_) for b_ in bits[1:])  # builds with other rows per CTA split K differently
    qw = q4k[m, k]
    qus = timed(lambda i: r.mul_mat(qw[i % len(qw)], xt, out=y), reps, torch)
    print(f"tq4_1s {m}x{k} T={t}: " + ", ".join(row) + f" us (all the same bits: {same}); q4_K exact {qus:.1f} us", flush=True)
