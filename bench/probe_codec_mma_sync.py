"""Probe: the codecs' fp16 mma.sync GEMM (mmq_<fmt>_f16_n*, the sm_89 / sm_120a prefill) on this GPU with
arch="sm_89", against the decode GEMV slices it replaces there (the GEMMs ruled out: mmq_min_tokens) and the
device's own route (sm_90: register-A wgmma). Graph-replayed µs per op over distinct weights (from HBM).
Usage (repository root): python3 bench/probe_codec_mma_sync.py [fmt,...] [T,...] [MxK]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ptxgen.runtime as r  # noqa: E402
from bench_op import graphed  # noqa: E402
from ptxgen import tuning  # noqa: E402
from ptxgen.testing.strategies import random_raw  # noqa: E402


def main():
    fmts = sys.argv[1].split(",") if len(sys.argv) > 1 else ["q5_K", "q6_K", "q8_0"]
    tokens = [int(v) for v in sys.argv[2].split(",")] if len(sys.argv) > 2 else [16, 64, 512]
    m, k = map(int, (sys.argv[3] if len(sys.argv) > 3 else "4096x14336").split("x"))
    rng = np.random.default_rng(0)
    print(f"{m}x{k}, graph µs per op over 8 distinct weights")
    print("| fmt | T | sm_89 GEMM | sm_89 GEMV slices | sm_90 route | kernels (sm_89) |")
    print("|---|---|---|---|---|---|")
    for fmt in fmts:
        raw = random_raw(fmt, m, k, rng)
        ws = [r.QuantTensor.from_raw(fmt, raw, (m, k)).to_device() for _ in range(8)]
        for t in tokens:
            x = torch.randn(t, k, device="cuda")
            ys = [torch.empty(t, m, device="cuda") for _ in range(8)]
            cells = []
            for arch, rules in (("sm_89", {}), ("sm_89", {"mmq_min_tokens": 1 << 30}), (None, {})):
                with tuning.override(**rules):
                    for w in ws:
                        w._plans.clear()
                    calls = 8 if t <= 64 or rules else 16
                    def op(i, ws=ws, x=x, ys=ys, arch=arch):
                        r.mul_mat(ws[i % 8], x, out=ys[i % 8], arch=arch)
                    cells.append(graphed(torch, op, calls=calls))
            names = " + ".join(dict.fromkeys(r.mul_mat_plan(ws[0], t, arch="sm_89").kernels))
            print(f"| {fmt} | {t} | {cells[0]:.1f} | {cells[1]:.1f} | {cells[2]:.1f} | {names} |", flush=True)
        del ws
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
