"""Probe: the register-A wgmma MMQ's token tile on shapes with few 128-row tiles (Llama's k / v / q projections at
prefill), kernel time per tile (torch.profiler, CUDA time of each kernel a call launches) with the plan's K splits —
for a tile rule by M as well as T. Diagnosis; the op's time is bench_op's.

    python3 bench/probe_mmq_tiles.py [--shapes 1024x4096,4096x4096] [--tokens 256,512] [--tiles 64,128,256] [--fmt q4_K]
"""
import argparse

import numpy as np

from bench_op import kernel_us


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1024x4096,4096x4096,4096x14336")
    ap.add_argument("--tokens", default="256,512")
    ap.add_argument("--tiles", default="64,128,256")
    ap.add_argument("--fmt", default="q4_K")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    import torch

    import ptxgen.runtime as r
    from ptxgen.runtime import ops
    from ptxgen.testing.strategies import random_raw

    print("| fmt | M×K | T | bn | K-steps per split, tiles n, splits | CTAs | kernel | µs per call |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        m, k = (int(v) for v in shape.split("x"))
        w = r.QuantTensor.from_raw(args.fmt, random_raw(args.fmt, m, k, np.random.default_rng(0)), (m, k)).to_device()
        for t in (int(v) for v in args.tokens.split(",")):
            x = np.random.default_rng(t).standard_normal((t, k)).astype(np.float32)
            xa = r.as_device_array(x)
            out = r.DeviceArray.empty((t, m), np.float32)
            flag = r.DeviceArray.empty((1,), np.uint32)
            flag.owner.fill_bytes(0)
            for bn in (int(v) for v in args.tiles.split(",")):
                tot = kernel_us(torch, lambda: ops.mmq_launch(w, xa, out, t, flag, bn=bn, path="wgmma_ra"), args.reps)
                pb = ops.PlanBuilder((t, k), np.float32, (t, m), np.float32)
                ops._rec_mmq(pb, w, pb.x, pb.y, t, 0, None, bn, "wgmma_ra")
                plan = pb.finish("probe")
                gemm = plan.launches[-1]
                for name, us in sorted(tot.items(), key=lambda kv: -kv[1]):
                    print(f"| {args.fmt} | {shape} | {t} | {bn} | {[a for a in gemm.args if isinstance(a, int)][3:6]} | {gemm.grid[0]} | {name} | "
                          f"{us:.1f} |", flush=True)


if __name__ == "__main__":
    main()
