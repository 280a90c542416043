"""Probe: the register-A wgmma MMQ n64 with two CTAs per SM (MmqSpec(64, a_regs=True, ctas_per_sm=2), built
in-process: .minnctapersm 2, setmaxnreg 24 / 104) against the emitted one-CTA n64 build, same run, whole op through
mmq_launch (convert_f16_perm + GEMM; weights rotated past the L2). ncu (session 18) found the register-A MMQ
latency-bound at T = 64 (9 warps per SM, 0.43 issued per scheduler); two CTAs per SM double the consumer warps, and
the one-round split planner then has 2 x 132 slots. Each result is finite, within 1e-3 of the one-CTA result, and
bit-identical on a second launch. The last column is mmq_launch's default path (what mul_mat runs).
Usage: probe_rega_2cta.py MxK,... T,... [reps]."""

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_cases, ptx_function, timed, zeroed_flag
from ptxgen.arch import get_arch
from ptxgen.kernels.mmq import MmqSpec, build
from ptxgen.runtime import kernels, ops

shapes, tokens, reps = probe_argv(30, lead=0)
NAME = "mmq_q4_k_wgmma_ra_n64"
one = kernels.load(NAME, "sm_90a")
k2 = build(get_arch("sm_90a"), MmqSpec(64, "wgmma", a_regs=True, ctas_per_sm=2))
text = k2.ptx()
two = ptx_function(r, text, k2.manifest(text), "sm_90a")
print(f"resident CTAs per SM: one-CTA build {one.resident_per_sm()}, two-CTA build {two.resident_per_sm()}")
flag = zeroed_flag(r)
key = (NAME, "sm_90a", "emitted")


def use(fn):
    kernels._BEST[key] = fn  # mmq_launch(bn=64) loads the n64 build by name: this one from now on


print("| M×K | T | n64, 1 CTA/SM µs (splits) | n64, 2 CTAs/SM µs (splits) | 1 / 2 | default path µs |")
print("|---|---|---|---|---|---|")
for m, k, raw, ws, t, x, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    got, us, sp = {}, {}, {}
    for tag, fn in (("1", one), ("2", two)):
        use(fn)
        runs = []
        for _ in range(2):
            y.fill_(float("nan"))
            ops.mmq_launch(ws[0], xa, ya, t, flag, bn=64, path="wgmma_ra_x16")
            runs.append(y.cpu().numpy())
        assert np.isfinite(runs[0]).all(), (tag, m, k, t)
        assert runs[0].tobytes() == runs[1].tobytes(), ("not deterministic", tag, m, k, t)
        got[tag] = runs[0]
        sp[tag] = ops.mmq_plan(fn, m, k, t, 64, False, r.current().sm_count).splits
        us[tag] = timed(lambda i: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, bn=64, path="wgmma_ra_x16"),
                        reps, torch)
    use(one)
    err = float(np.linalg.norm(got["2"] - got["1"]) / np.linalg.norm(got["1"]))
    assert err < 1e-3, (m, k, t, err)
    dflt = timed(lambda i: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag), reps, torch)
    print(f"| {m}×{k} | {t} | {us['1']:.1f} ({sp['1']}) | {us['2']:.1f} ({sp['2']}) | {us['1'] / us['2']:.3f}x | "
          f"{dflt:.1f} |", flush=True)
