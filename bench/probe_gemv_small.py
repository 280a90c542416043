"""Probe: where a small decode GEMV's time goes. bench_model's decode step spends 10 µs an op on attn_q / attn_o
(Q4_K 4096x4096, 9.4 MB: the PDL floor is 2.2 µs) and 5-6 on attn_k / attn_v (1024x4096: 0.8), more than twice
the floor's share of the large weights. For each shape this times, in a graph-replayed loop over 24 distinct
weights (from HBM): the op as shipped; each of its launches alone (the prep; the GEMV with its PDL launch, and
without); the op with the GEMV's K splits forced (ops.gemv_splits patched); the streaming floor (plain / PDL).
Usage (repository root): python3 bench/probe_gemv_small.py [fmt:MxK,...] [T] [rule=value,...] (tuning overrides)"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

SHAPES = "q4_K:4096x4096,q4_K:1024x4096,q6_K:1024x4096,q4_K:14336x4096"
SPLITS = (1, 2, 4, 8, 16, 32)


def main():
    import torch

    import ptxgen.runtime as r
    from bench_op import graphed, read_floor_kernels
    from ptxgen import formats
    from ptxgen.runtime import ops
    from ptxgen.runtime.plans import Plan
    from ptxgen.testing.strategies import random_raw

    shapes = sys.argv[1] if len(sys.argv) > 1 else SHAPES
    t = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    if len(sys.argv) > 3:
        from ptxgen import tuning
        tuning.set(**{kv.split("=")[0]: int(kv.split("=")[1]) for kv in sys.argv[3].split(",")})
    n = 24
    real_splits = ops.gemv_splits
    for spec in shapes.split(","):
        fmt, mk = spec.split(":")
        m, k = map(int, mk.split("x"))
        raw = random_raw(fmt, m, k, np.random.default_rng(0))
        ws = [r.QuantTensor.from_raw(fmt, raw, (m, k)).to_device() for _ in range(n)]
        nbytes = m * formats.get(fmt).row_bytes(k)
        x = torch.randn(t, k, device="cuda")
        ys = [torch.empty(t, m, device="cuda") for _ in range(n)]
        plain, pdl = read_floor_kernels(torch, ws, nbytes)
        print(f"\n{fmt} {m}x{k}, T = {t}, {nbytes / 1e6:.1f} MB; floor plain / PDL "
              f"{graphed(torch, plain, calls=4 * n):.1f} / {graphed(torch, pdl, calls=4 * n):.1f} µs")
        print("| what | graph µs per op |\n|---|---|")

        def op(i):
            r.mul_mat(ws[i % n], x, out=ys[i % n])
        op(0)
        want = ys[0].double().cpu()
        plan = ops.mul_mat_plan(ws[0], t, graph=True)
        print(f"| shipped: {' + '.join(plan.kernels)} {[ln.grid for ln in plan.launches]} | "
              f"{graphed(torch, op, calls=4 * n):.1f} |", flush=True)
        plans = [ops.mul_mat_plan(w, t, graph=True) for w in ws]
        for j, ln in enumerate(plans[0].launches):
            for pdl_on in sorted({ln.pdl, False}, reverse=True):
                subs = [Plan([p.launches[j]._replace(pdl=pdl_on)], p.scratch_sizes, p.counter_bytes, p.ready_bytes)
                        for p in plans]

                def one(i, subs=subs):
                    ops.run_plan(subs[i % n], x.data_ptr(), ys[i % n].data_ptr(), torch.cuda.current_stream())
                print(f"| {ln.fn.name} alone{' (PDL launch)' if pdl_on else ''} | "
                      f"{graphed(torch, one, calls=4 * n):.1f} |", flush=True)
        split = [ln.fn for ln in plan.launches if "split_k" in ln.fn.meta]
        if split:
            steps = -(-(k // int(split[0].meta.get("lane_cols", 32))) // 32)
            for s in [v for v in SPLITS if v <= steps]:
                ops.gemv_splits = lambda *a, s=s, **kw: s
                try:
                    for w in ws:
                        w._plans.clear()
                    us = graphed(torch, op, calls=4 * n)
                    got = ys[0].double().cpu()
                    diff = float((got - want).norm() / want.norm())
                    print(f"| {s} K splits | {us:.1f} (rel. diff {diff:.0e}) |", flush=True)
                finally:
                    ops.gemv_splits = real_splits
                    for w in ws:
                        w._plans.clear()
        ws = plans = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
