"""Split-K sweep for a split GEMV (device time per mul_mat call, weights from HBM): probe_splits.py FMT T SPLITS
SHAPES, e.g. `probe_splits.py q4_K 8 0,1,2,3,4 14336x4096,4096x14336` (0 = the planner's choice). It overrides
runtime.ops.gemv_splits (the planner) for every GEMV of the call and checks each result against the first."""
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_gemv import random_raw, timed, weight_copies  # noqa: E402

import ptxgen.runtime as r  # noqa: E402
from ptxgen.runtime import ops  # noqa: E402

fmt, t = sys.argv[1], int(sys.argv[2])
choices = [int(v) for v in sys.argv[3].split(",")]
shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[4].split(",")]
planner = ops.gemv_splits
import torch  # noqa: E402

rng = np.random.default_rng(0)
for m, k in shapes:
    raw = random_raw(fmt, m, k, rng)
    ws = weight_copies(r, fmt, raw, m, k)
    copies = len(ws)
    x = torch.randn(t, k, device="cuda", dtype=torch.float32)
    y = torch.empty(t, m, device="cuda", dtype=torch.float32)
    first, cells = None, []
    for s in choices:
        chosen = []

        def plan(*a, s=s, **kw):
            chosen.append(planner(*a, **kw) if s == 0 else s)
            return chosen[-1]

        ops.gemv_splits = plan
        r.mul_mat(ws[0], x, out=y)
        got = y.cpu().numpy()
        first = got if first is None else first
        rel = float(np.linalg.norm(got - first) / np.linalg.norm(first))
        assert rel < 1e-5, (m, k, s, rel)
        us = timed(lambda i: r.mul_mat(ws[i % copies], x, out=y), 40, torch)
        cells.append(f"{'auto' if s == 0 else s}({chosen[0]}): {us:.1f}")
    ops.gemv_splits = planner
    print(f"{fmt} {m}x{k} T={t} splits(chosen) µs: " + "  ".join(cells), flush=True)
