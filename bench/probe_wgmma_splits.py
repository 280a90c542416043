"""Probe: K splits of the sm_90a MMQ builds (mmq_launch path wgmma / wgmma_ra) where the tiles do not fill one
round of the resident CTAs (e.g. 14336x4096 at T <= 256: 112 tiles of 128 rows on 132 SMs, no split today) — the
planner (ops.splitk_plan_one_round: splits only while tiles x splits fit one round) overridden per run with
`s` splits of ceil(steps / s) K-steps (`0` = the planner's). Each result within 1e-3 of the first's and finite;
bench_mmq's timing (mmq_launch alone, weights from HBM). Usage: probe_wgmma_splits.py PATH:BN SPLITS MxK,... T,...
[reps], e.g. wgmma_ra:128 0,2,3,4,7 14336x4096 64,128."""
import sys

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import random_raw, timed, weight_copies
from ptxgen.runtime import ops

path, bn = sys.argv[1].split(":")
bn = int(bn)
choices = [int(v) for v in sys.argv[2].split(",")]
shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[3].split(",")]
tokens = [int(v) for v in sys.argv[4].split(",")]
reps = int(sys.argv[5]) if len(sys.argv) > 5 else 40
planner = ops.splitk_plan_one_round
rng = np.random.default_rng(0)
flag = r.DeviceArray.empty((1,), np.uint32)
for m, k in shapes:
    raw = random_raw("q4_K", m, k, rng)
    ws = weight_copies(r, "q4_K", raw, m, k)
    for t in tokens:
        x = torch.randn(t, k, device="cuda", dtype=torch.float32)
        y = torch.empty(t, m, device="cuda", dtype=torch.float32)
        xa, ya = r.as_device_array(x), r.as_device_array(y)
        first, cells = None, []
        for s in choices:
            chosen = []

            def plan(tiles, steps, slots, s=s):
                got = planner(tiles, steps, slots) if s == 0 else (-(-steps // -(-steps // s)), -(-steps // s))
                chosen.append(got)
                return got
            ops.splitk_plan_one_round = plan
            y.fill_(float("nan"))
            ops.mmq_launch(ws[0], xa, ya, t, flag, bn=bn, path=path)
            got = y.cpu().numpy()
            assert np.isfinite(got).all(), (m, k, t, s)
            first = got if first is None else first
            err = float(np.linalg.norm(got - first) / np.linalg.norm(first))
            assert err < 1e-3, (m, k, t, s, err)
            us = timed(lambda i: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, bn=bn, path=path), reps, torch)
            cells.append(f"{'auto' if s == 0 else s}{chosen[0]}: {us:.1f}")
        ops.splitk_plan_one_round = planner
        print(f"{path} n{bn} {m}x{k} T={t} splits(splits, per) µs: " + "  ".join(cells), flush=True)
