"""Probe: the mma.sync MMQ's split fixup, spread over the split CTAs vs summed by the last (tuning.set(mmq_spread_max_splits=0)),
fused and x16; the bits of both must agree. Usage: probe_mmq_spread_fixup.py - MxK,... T,... [reps]."""
import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import mmq_checked, probe_argv, probe_cases, timed
from ptxgen import formats, tuning
from ptxgen.runtime import ops
from ptxgen.runtime.ops import mmq_launch

_, shapes, tokens, reps = probe_argv(30)
flag = r.DeviceArray.empty((1,), np.uint32)
for m, k, raw, ws, t, x, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    ref = formats.gemm_ref("q4_K", raw, m, k, x.cpu().numpy()) if t == tokens[0] else None
    row = {}
    for path in ("mma.sync", "mma.sync_x16"):
        bits = {}
        for mode, mx in (("last", 0), ("spread", 4)):
            tuning.set(mmq_spread_max_splits=mx)
            bits[mode] = mmq_checked(mmq_launch, ws[0], x, y, t, flag, path, ref)
            row[f"{path} {mode}"] = timed(lambda i: mmq_launch(ws[i % len(ws)], xa, ya, t, flag, path=path, arch="sm_89"),
                                          reps, torch)
        assert np.array_equal(bits["last"], bits["spread"]), f"{path}: spread != last bits"
    tuning.reset()
    bn = next((n for n in (32, 64, 128) if t <= n), 128)
    tiles = -(-t // bn) * -(-m // 128)
    print(f"{m}x{k} T={t} plan {ops.splitk_plan_tail(tiles, k // 64, 132)}: "
          + ", ".join(f"{a} {v:.1f}" for a, v in row.items()) + " us", flush=True)
