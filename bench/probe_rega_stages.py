"""Probe: the register-A wgmma MMQ's ring depth at mid T. The emitted builds have WG_STAGES = 4 TMA stages (sized for
n256: 4 x 38 KB); an n64 stage is 14 KB and an n128 one 22 KB, so 6 or 8 stages fit. If a CTA's K loop waits on
its TMA loads (DRAM latency over 4 stages in flight), deeper rings shorten each step. Builds made in-process with
mmq.WG_STAGES patched, swapped in under the emitted name (mmq_launch loads the build by name), timed in the same run
as the emitted one: whole op through mmq_launch (convert_f16_perm + GEMM; weights rotated past the L2). The ring
depth does not change the arithmetic, so every build's output must be bit-identical to the emitted build's (and
finite). Usage: probe_rega_stages.py MxK,... T,... [reps] (the token tile mul_mat's rule gives T: ops._rega_tile)."""

import numpy as np
import torch

import ptxgen.kernels.mmq as mmq
import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_cases, ptx_function, timed, zeroed_flag
from ptxgen.arch import get_arch
from ptxgen.runtime import kernels, ops

shapes, tokens, reps = probe_argv(30, lead=0)
DEPTHS = (4, 6, 8)
builds = {}
for bn in sorted({ops._rega_tile(t) for t in tokens}):
    name = f"mmq_q4_k_wgmma_ra_n{bn}"
    builds[bn] = {4: kernels.load(name, "sm_90a")}
    for s in DEPTHS[1:]:
        mmq.WG_STAGES = s
        try:
            k_ = mmq.build(get_arch("sm_90a"), mmq.MmqSpec(bn, "wgmma", a_regs=True))
        except Exception as e:  # n256: 6 stages do not fit the shared memory
            print(f"n{bn} {s} stages: {type(e).__name__}: {e}")
            continue
        finally:
            mmq.WG_STAGES = 4
        text = k_.ptx()
        builds[bn][s] = ptx_function(r, text, k_.manifest(text), "sm_90a")
flag = zeroed_flag(r)
print("| M×K | T | tile | " + " | ".join(f"{s} stages µs" for s in DEPTHS) + " | 4 / best |")
print("|---|---|---|" + "---|" * (len(DEPTHS) + 1))
for m, k, raw, ws, t, x, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    bn = ops._rega_tile(t)
    key = (f"mmq_q4_k_wgmma_ra_n{bn}", "sm_90a", "emitted")
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    base, us = None, {}
    for s, fn in builds[bn].items():
        kernels._BEST[key] = fn
        y.fill_(float("nan"))
        ops.mmq_launch(ws[0], xa, ya, t, flag, bn=bn, path="wgmma_ra_x16")
        got = y.cpu().numpy()
        assert np.isfinite(got).all(), (m, k, t, s)
        base = got if base is None else base
        assert got.tobytes() == base.tobytes(), ("bits differ from the 4-stage build", m, k, t, s)
        us[s] = timed(lambda i: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, bn=bn, path="wgmma_ra_x16"),
                      reps, torch)
    kernels._BEST[key] = builds[bn][4]
    cells = " | ".join(f"{us[s]:.1f}" if s in us else "n/a" for s in DEPTHS)
    print(f"| {m}×{k} | {t} | n{bn} | {cells} | {us[4] / min(us.values()):.3f}x |", flush=True)
