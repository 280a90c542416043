"""Probe: builds of the exact TQ4_1S GEMVs side by side through mul_mat, built from the DSL here. Family `tma`
(gemv_tq4_1s_tma_t1/t2, T ≤ 2): the 16-entry codebook table (`lut`: one LDS per weight, 4 warps, 3 stages, 4 CTAs
per SM) against pair tables (one LDS.64 per qs byte); family `mma` (gemv_tq4_1s_mma{,_m16}, T = 3-8): the
per-element (hi, lo) table (`lut`) against pair tables of A words. A pair variant is
<copies>w<warps>s<stages>c<CTAs per SM>, e.g. 16w4s2c4, and for the tma family optionally r<rows per warp> (default
gemv.TMA_ROWS). Each build within 1e-5 of the float64 reference; Q4_K's exact op on the same shape in the same run
(#7: TQ4_1S ≤ 1.15× Q4_K's time). Usage: probe_tq4_pairs.py FAMILY:VARIANTS MxK,... T,... [reps] (VARIANTS
comma-separated), e.g. tma:lut,16w4s2c4 or mma:lut,16w8s2c2."""
import re

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_cases, probe_weights, timed
from ptxgen import formats
from ptxgen.kernels import KERNELS, KernelDef, gemv
from ptxgen.runtime import kernels

what, shapes, tokens, reps = probe_argv(40)
family, variants = what.split(":")
variants = variants.split(",")
NAMES = {"tma": r"gemv_tq4_1s_tma_t(\d)", "mma": r"gemv_tq4_1s_mma(_m16)?"}[family]
load = kernels.load


def tma_build(t, cfg, rows):  # rows: the TMA kernel's rows per warp (gemv.TMA_ROWS) for this build
    def build(arch):
        saved = dict(gemv.TMA_ROWS)
        gemv.TMA_ROWS[t] = rows or saved[t]
        try:
            return gemv.build_tma_lanes(arch, t, cfg)
        finally:
            gemv.TMA_ROWS.clear()
            gemv.TMA_ROWS.update(saved)
    return build


for v in variants:
    cfg, rows = None, None
    if v != "lut":
        *cfg, rows = re.fullmatch(r"(\d+)w(\d+)s(\d+)c(\d+)(?:r(\d+))?", v).groups()
        cfg, rows = tuple(int(n) for n in cfg), rows and int(rows)
    for sfx in (("1", "2") if family == "tma" else ("", "_m16")):
        build = (tma_build(int(sfx), cfg, rows) if family == "tma" else
                 (lambda arch, small=bool(sfx), cfg=cfg: gemv.build_mma_gemv(arch, small, cfg)))
        KERNELS[f"probe_{v}{sfx}"] = KernelDef(f"probe_{v}{sfx}", "probe", build, archs=("sm_90a",))


def variant_load(v):  # the family's kernel names -> the variant's builds
    def f(name, *a, **kw):
        m = re.fullmatch(NAMES, name)
        return load(f"probe_{v}{m.group(1) or ''}", *a, source="dsl") if m else load(name, *a, **kw)
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
