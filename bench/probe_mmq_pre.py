"""Probe (#6, large T): the prepared register-A MMQ (dequantize_q4_k_frags, then mmq_q4_k_wgmma_pre_n256 loading
the fp16 fragments by TMA: no dequant in the K loop) against the register-A build that dequantizes in its loop, same
run, whole op (fp32 x in, fp32 y out), and cuBLAS fp16 on dequantized weights for scale. Each path's result is
checked against the register-A build's (NaN-poisoned y, relative difference printed) before it is timed. The
kernel split (CUPTI) of the prepared op says what its extra pass costs.
Usage: probe_mmq_pre.py MxK,... T,... [reps]."""
import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import kernel_times, probe_argv, probe_cases, timed, zeroed_flag
from ptxgen.runtime import ops

shapes, tokens, reps = probe_argv(20, lead=0)
flag = zeroed_flag(r)
PATHS = ("wgmma_ra", "wgmma_pre", "wgmma_pre_cx", "wgmma_pre_x16")


def kernel_split(launch):
    per = kernel_times(torch, launch, 5, skip=("sleep", "at::"))
    return " + ".join(f"{n.split('(')[0]} {us:.1f}" for n, us in per.items())


print(f"| M×K | T | {' | '.join(p + ' µs' for p in PATHS)} | cuBLAS fp16 µs | pre / ra | cuBLAS / pre | "
      "max rel. diff to ra | prepared op's kernels (CUPTI µs): converting; after convert_f16_perm |")
print("|---|---|" + "---|" * (len(PATHS) + 5))
for m, k, raw, ws, t, x, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    base, diffs, cells = None, [], {}
    for p in PATHS:
        y.fill_(float("nan"))
        ops.mmq_launch(ws[0], xa, ya, t, flag, path=p)
        got = y.cpu().numpy().astype(np.float64)
        assert np.isfinite(got).all(), f"{p}: non-finite (unwritten) outputs"
        if base is None:
            base = got
        else:
            diffs.append(float(np.linalg.norm(got - base) / np.linalg.norm(base)))
        cells[p] = timed(lambda i, p=p: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, path=p), reps, torch)
    assert not int(flag.numpy()[0]), "overflow flag raised on random data"
    wf = torch.randn(m, k, device="cuda", dtype=torch.float16)
    wfs = [wf] + [wf.clone() for _ in range(max(1, int(4 * 60e6 // wf.nbytes)))]
    xh = x.half()
    cub = timed(lambda i: torch.matmul(xh, wfs[i % len(wfs)].T), reps, torch)
    split = "; ".join(kernel_split(lambda i, p=p: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, path=p))
                      for p in ("wgmma_pre_cx", "wgmma_pre_x16"))
    print(f"| {m}×{k} | {t} | {' | '.join(f'{v:.1f}' for v in cells.values())} | {cub:.1f} | "
          f"{cells['wgmma_pre'] / cells['wgmma_ra']:.3f} | {cub / cells['wgmma_pre']:.3f} | {max(diffs):.1e} | {split} |",
          flush=True)
