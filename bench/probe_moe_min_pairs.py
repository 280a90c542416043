"""Probe: where mul_mat_id's grouped tensor-core route (moe_group + mmq_<fmt>_f16_n*_moe + the gated exact GEMV)
starts to beat the fp32 grouped GEMV alone — the tuning rule moe_gemm_min_pairs. For bench_moe's two shapes and
T = 1 ... 16, graph-replayed µs per op of both routes (tuning.override forces each), weights rotating over copies
that pass 4x the L2 as bench_moe does, the two results compared first (relative error < 2e-3). Prints a markdown
table and the smallest pair count from which the GEMM route wins at every larger T of the shape.

    python3 bench/probe_moe_min_pairs.py [--formats q4_K,q6_K] [--tokens 1,2,3,4,6,8,12,16]
"""
import argparse

import numpy as np

from bench_moe import SHAPES, copies_for, expert_bytes, routing


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="q4_K")
    ap.add_argument("--tokens", default="1,2,3,4,6,8,12,16")
    args = ap.parse_args()
    import torch

    import ptxgen.runtime as r
    from bench_op import graphed
    from ptxgen import tuning
    from ptxgen.runtime import ops
    from ptxgen.testing.strategies import random_raw

    tokens = [int(v) for v in args.tokens.split(",")]
    print("| fmt | shape | T | pairs | GEMV µs (graph) | grouped GEMM route µs (graph) | GEMM route kernels |")
    print("|---|---|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        for e, top, m, k in SHAPES:
            raw = random_raw(fmt, e * m, k, np.random.default_rng(0))
            eb = expert_bytes(fmt, m, k)
            wins = []
            for t in tokens:
                ids_h = routing(e, top, t)
                used = len(np.unique(ids_h))
                ws = [r.QuantTensor.from_raw(fmt, raw, (e, m, k)).to_device() for _ in range(copies_for(used * eb))]
                ids, x = torch.as_tensor(ids_h, device="cuda"), torch.randn(t, k, device="cuda")
                y = torch.empty(t, top, m, device="cuda")
                res, outs = {}, {}
                for route, pairs in (("gemv", 1 << 30), ("gemm", 1)):
                    with tuning.override(moe_gemm_min_pairs=pairs):
                        call = lambda i: r.mul_mat_id(ws[i % len(ws)], x, ids, out=y)  # noqa: E731
                        call(0)
                        outs[route] = y.clone()
                        res[route] = graphed(torch, call)
                        kernels = " + ".join(ops.mul_mat_id_kernels(fmt, t, top, e, k, m))
                err = float(((outs["gemm"] - outs["gemv"]).double().norm() / outs["gemv"].double().norm()).item())
                assert err < 2e-3, f"{fmt} T={t}: the routes differ by {err:.2e}"
                wins.append((t * top, res["gemm"] < res["gemv"]))
                print(f"| {fmt} | {e}x top-{top} {m}x{k} | {t} | {t * top} | {res['gemv']:.1f} | {res['gemm']:.1f} | "
                      f"{kernels} |", flush=True)
                torch.cuda.empty_cache()
            first = next((p for i, (p, _) in enumerate(wins) if all(w for _, w in wins[i:])), None)
            print(f"\n{fmt} {e}x top-{top}: the GEMM route wins from {first} pairs on\n" if first else
                  f"\n{fmt} {e}x top-{top}: the GEMM route does not win at every larger T\n")


if __name__ == "__main__":
    main()
