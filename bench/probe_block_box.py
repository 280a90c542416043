"""Probe: the nibble codecs' block box (kernels/mmq.py NIBBLE_BLOCK_BOX: a block's 16-byte columns loaded once into
an A slot for its 4 K-steps; Q5_K 11 columns a block against 5 a step, Q4_K 9 against 3) against the shipped
register-A builds, in one process: every mmq_<fmt>_wgmma_ra_n* build rebuilt from the DSL with the switch on and
swapped in for the emitted one, mul_mat timed graph-replayed over 8 distinct weights, y compared bit for bit with
the shipped build's. What the Q6_K block box (7e6922b) gained at T = 512: 140.8 -> 120.2 µs on 4096x14336.
Usage (repository root): python3 bench/probe_block_box.py [fmt,...] [MxK] [T,...]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

TILES = (64, 128, 256)


def swap(names, on: bool, fmt: str):
    """Load each register-A build of `fmt` from the DSL with NIBBLE_BLOCK_BOX[fmt] = on, in place of the emitted."""
    from ptxgen.kernels import mmq
    from ptxgen.runtime import kernels
    from ptxgen.runtime.compiler import compile_ptx
    from ptxgen.runtime.driver import Module

    mmq.NIBBLE_BLOCK_BOX[fmt] = on
    for name in names:
        text, entry = kernels.ptx_source(name, "sm_90a", "dsl")
        if entry["meta"].get("compile") == "whole-program":  # as kernels.load: the driver's JIT honours setmaxnreg
            mod = Module(text.encode() + b"\0", name)
        else:
            mod = Module(compile_ptx(text, "sm_90a", name=name).cubin, name)
        fn = mod.function(entry["entry"], entry["params"], entry["block"], entry.get("dynamic_smem", 0))
        fn.meta, fn.arch = entry["meta"], "sm_90a"
        kernels._BEST[(name, None, "emitted")] = fn


def main():
    import torch

    import ptxgen.runtime as r
    from bench_op import graphed
    from ptxgen.testing.strategies import random_raw

    fmts = sys.argv[1].split(",") if len(sys.argv) > 1 else ["q5_K", "q4_K"]
    m, k = map(int, (sys.argv[2] if len(sys.argv) > 2 else "4096x14336").split("x"))
    tokens = [int(v) for v in sys.argv[3].split(",")] if len(sys.argv) > 3 else [16, 64, 512, 4096]
    n = 8
    print(f"{m}x{k}, graph µs per op over {n} weights: shipped (a box a step) / block box; y bit for bit")
    print("| fmt | T | shipped | block box | same bits | kernels |\n|---|---|---|---|---|---|")
    for fmt in fmts:
        names = [f"mmq_{fmt.lower()}_wgmma_ra_n{bn}" for bn in TILES]
        raw = random_raw(fmt, m, k, np.random.default_rng(0))
        ws = [r.QuantTensor.from_raw(fmt, raw, (m, k)).to_device() for _ in range(n)]
        for t in tokens:
            x = torch.randn(t, k, device="cuda")
            ys = [torch.empty(t, m, device="cuda") for _ in range(n)]
            cells, got = [], []
            for on in (False, True):
                swap(names, on, fmt)
                for w in ws:
                    w._plans.clear()
                cells.append(graphed(torch, lambda i: r.mul_mat(ws[i % n], x, out=ys[i % n]), calls=4 * n))
                got.append(ys[0].clone())
            same = torch.equal(got[0].view(torch.int32), got[1].view(torch.int32))
            print(f"| {fmt} | {t} | {cells[0]:.1f} | {cells[1]:.1f} | {same} | "
                  f"{' + '.join(r.mul_mat_plan(ws[0], t).kernels)} |", flush=True)
        swap(names, False, fmt)
        ws = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
