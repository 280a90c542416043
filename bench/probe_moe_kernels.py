"""Probe: mul_mat_id's kernels one by one — CUDA time per kernel (torch.profiler) of each kernel a call launches,
for bench_moe's shapes, a few T, the GEMM route forced (tuning.override). Diagnosis for the grouped GEMM's gap
to its estimate; the op's own time is bench_moe's.

    python3 bench/probe_moe_kernels.py [--formats q4_K,q8_0] [--tokens 1,32,512] [--route gemm|gemv|pair|auto]
        [--rule 'moe_wgmma_tile_pairs={"n64": 0, "n128": 1000}'] ...  (tuning rules, JSON values; each --rule set is one sweep)
"""
import argparse

import numpy as np

from bench_moe import SHAPES, routing
from bench_op import kernel_us


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="q4_K,q8_0")
    ap.add_argument("--tokens", default="1,32,512")
    ap.add_argument("--route", default="gemm")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rule", action="append", default=[], metavar="NAME=JSON",
                    help="run the whole sweep once more with this tuning rule (repeatable)")
    args = ap.parse_args()
    import json
    import torch

    import ptxgen.runtime as r
    from ptxgen import tuning
    from ptxgen.testing.strategies import random_raw

    forced = {"gemm": {"moe_gemm_min_pairs": 1, "moe_pair_max_weights": 0},  # the route forced (auto: the rules')
              "gemv": {"moe_gemm_min_pairs": 1 << 30, "moe_pair_max_weights": 0},
              "pair": {"moe_pair_max_weights": 1 << 40}}.get(args.route, {})
    print("| fmt | shape | T | kernel | µs per call | rules |")
    print("|---|---|---|---|---|---|")
    sweeps = [{}] + [{r.split("=", 1)[0]: json.loads(r.split("=", 1)[1])} for r in args.rule]
    for fmt, rules in ((f, r) for f in args.formats.split(",") for r in sweeps):
        for e, top, m, k in SHAPES:
            w = r.QuantTensor.from_raw(fmt, random_raw(fmt, e * m, k, np.random.default_rng(0)), (e, m, k)).to_device()
            for t in (int(v) for v in args.tokens.split(",")):
                ids = torch.as_tensor(routing(e, top, t), device="cuda")
                x, y = torch.randn(t, k, device="cuda"), torch.empty(t, top, m, device="cuda")
                with tuning.override(**{**forced, **rules}):
                    tot = kernel_us(torch, lambda: r.mul_mat_id(w, x, ids, out=y), args.reps)
                for name, us in sorted(tot.items(), key=lambda kv: -kv[1]):
                    print(f"| {fmt} | {e}x top-{top} {m}x{k} | {t} | {name} | {us:.1f} | {rules or ''} |",
                          flush=True)


if __name__ == "__main__":
    main()
