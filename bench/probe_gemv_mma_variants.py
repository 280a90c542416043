"""Probe: variants of the codecs' tensor-core GEMV (kernels/gemv_mma_codec.py, the TMA build) built in this process
with other module constants — resident CTAs an SM (CTAS; the ring's stages follow), B tiles loaded ahead and
register sets (GROUP_AHEAD) — each swapped in for the shipped build and timed through mul_mat in a graph-replayed
decode loop over 24 distinct weights (from HBM), beside the shipped one; y checked against the shipped build's
(the same bits where the split count is the same, else within fp32 rounding). Prints each variant's registers and
spills first (ptxas). One device call answers what the NOTES ask of a shape, before a build ships.
Usage (repository root): python3 bench/probe_gemv_mma_variants.py [fmt] [MxK] [T,...]"""
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

VARIANTS = {  # name: module constants of gemv_mma_codec
    "shipped": {},
    "4 CTAs an SM (128 registers, 3 stages)": {"CTAS": 4},
    "B 3 blocks ahead": {"GROUP_AHEAD": {1: (3, 4), 2: (1, 2)}},
    "B 1 block ahead, 2 sets": {"GROUP_AHEAD": {1: (1, 2), 2: (1, 2)}},
}


@contextlib.contextmanager
def constants(module, values):
    old = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


def build_variant(fmt, values):
    """(Function, ptxas resources) of the TMA build of `fmt` with `values` for gemv_mma_codec's constants."""
    from ptxgen.arch import get_arch
    from ptxgen.kernels import gemv_mma_codec as G
    from ptxgen.runtime.compiler import compile_ptx
    from ptxgen.runtime.driver import Module

    with constants(G, values):
        kern = G.build(get_arch("sm_90a"), fmt, 1, tma=True)
    ptx = kern.ptx()
    entry = kern.manifest(ptx)
    res = compile_ptx(ptx, "sm_90a", name=kern.name)
    fn = Module(res.cubin, kern.name).function(entry["entry"], entry["params"], entry["block"], entry["dynamic_smem"])
    fn.meta, fn.arch = entry["meta"], "sm_90a"
    return fn, res.resources.get(kern.name, {})


def main():
    import torch

    import ptxgen.runtime as r
    from bench_op import graphed
    from ptxgen import tuning
    from ptxgen.runtime import kernels
    from ptxgen.specs import GemvKernel
    from ptxgen.testing.strategies import random_raw

    fmt = sys.argv[1] if len(sys.argv) > 1 else "q6_K"
    m, k = map(int, (sys.argv[2] if len(sys.argv) > 2 else "4096x14336").split("x"))
    tokens = [int(v) for v in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1, 8]
    name = GemvKernel("mma", fmt, 8, tma=True).name
    raw = random_raw(fmt, m, k, np.random.default_rng(0))
    ws = [r.QuantTensor.from_raw(fmt, raw, (m, k)).to_device() for _ in range(24)]
    print(f"{name} variants, {m}x{k}, decode loop over 24 weights, graph µs per op")
    print("| variant | registers / spill bytes | " + " | ".join(f"T = {t}" for t in tokens) + " | max rel. diff |")
    print("|---|---|" + "---|" * len(tokens) + "---|")
    ref = {}
    with tuning.override(codec_mma_min_tokens=1, codec_mma_t1_min_rows=0):
        for label, values in VARIANTS.items():
            fn, res = build_variant(fmt, values)
            kernels._BEST[(name, None, "emitted")] = fn
            cells, diff = [], 0.0
            for t in tokens:
                for w in ws:
                    w._plans.clear()
                x = torch.randn(t, k, device="cuda", generator=torch.Generator("cuda").manual_seed(t))
                ys = [torch.empty(t, m, device="cuda") for _ in range(24)]
                assert name in r.mul_mat_plan(ws[0], t).kernels
                cells.append(graphed(torch, lambda i, x=x, ys=ys: r.mul_mat(ws[i % 24], x, out=ys[i % 24]),
                                     calls=96))
                got = ys[0].double().cpu()
                want = ref.setdefault(t, got)
                diff = max(diff, float((got - want).norm() / want.norm()))
            print(f"| {label} | {res.get('registers')} / {res.get('spill_stores', 0)} | "
                  + " | ".join(f"{c:.1f}" for c in cells) + f" | {diff:.1e} |", flush=True)
    kernels._BEST.pop((name, None, "emitted"), None)


if __name__ == "__main__":
    main()
