"""Probe: the prefill GEMMs of the small attention matrices (#34's last row) on each lowering the H200 can run —
the shipped sm_90a plan (register-A wgmma), the mma.sync plans of sm_89 (its fp16 MMQ reading fp32 x, and with
PTXGEN_MMQ_X16=1 reading fp16 x as given) — beside cuBLAS fp16 F.linear, graph-replayed over rotating weights.

    python3 bench/probe_small_prefill.py [--formats q4_K,q6_K] [--shapes 1024x4096,4096x4096] [--tokens 512]

Prints graph µs per call and each variant's largest relative difference from the shipped plan's y."""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

VARIANTS = (("sm_90a", None, {}), ("sm_89", "sm_89", {}), ("sm_89 x16", "sm_89", {"PTXGEN_MMQ_X16": "1"}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="q4_K,q6_K")
    ap.add_argument("--shapes", default="1024x4096,4096x4096,14336x4096")
    ap.add_argument("--tokens", default="512")
    ap.add_argument("--x-dtype", default="float16", choices=("float16", "float32"))
    args = ap.parse_args()
    import torch

    import ptxgen.runtime as r
    from bench_gemv import probe_weights
    from bench_op import graphed
    from ptxgen import formats, knobs
    from ptxgen.runtime import ops

    print(f"{torch.cuda.get_device_name()}, x {args.x_dtype}; graph µs per call over rotating weights")
    print("| fmt | M×K | T | " + " | ".join(v[0] for v in VARIANTS) + " | cuBLAS fp16 | kernels (sm_90a / sm_89 / x16) |")
    print("|---|---|---|" + "---|" * (len(VARIANTS) + 2))
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    for fmt in args.formats.split(","):
        for m, k, raw, ws in probe_weights(r, fmt, shapes):
            dense = torch.from_numpy(formats.dequantize(fmt, raw, (m, k)).astype(np.float16)).cuda()
            dws = [dense.clone() for _ in range(max(2, len(ws) // 3))]
            for w in ws:
                w.to_device()
            for t in (int(v) for v in args.tokens.split(",")):
                x = torch.randn(t, k, device="cuda").to(getattr(torch, args.x_dtype))
                y = torch.empty(t, m, device="cuda")
                cells, names, ref = [], [], None
                for _, arch, forced in VARIANTS:
                    with knobs.override(**forced):
                        names.append("+".join(ops.mul_mat_plan(ws[0], t, arch=arch, x_dtype=args.x_dtype).kernels))
                        r.mul_mat(ws[0], x, out=y, arch=arch)
                        torch.cuda.synchronize()
                        got = y.cpu().numpy().astype(np.float64)
                        ref = got if ref is None else ref
                        diff = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
                        us = graphed(torch, lambda i, arch=arch: r.mul_mat(ws[i % len(ws)], x, out=y, arch=arch),
                                     calls=4 * len(ws))
                    cells.append(f"{us:.1f}" + (f" (Δ {diff:.0e})" if diff else ""))
                xh = x.half()
                cub = graphed(torch, lambda i: torch.nn.functional.linear(xh, dws[i % len(dws)]), calls=4 * len(dws))
                print(f"| {fmt} | {m}×{k} | {t} | " + " | ".join(cells) + f" | {cub:.1f} | {' / '.join(names)} |",
                      flush=True)


if __name__ == "__main__":
    main()
