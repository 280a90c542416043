"""Probe: the mma.sync MMQ under fixed split plans (whole, splits, K-steps per split) instead of splitk_plan_tail's,
to calibrate its cost model: probe_split_plans.py MxK T whole:splits:per,... [reps] (T > 64: the n128 tile). Each plan is checked against
the float64 reference (1e-3) first; bench_mmq's timing (weights from HBM)."""
import sys

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_weights, timed
from ptxgen import formats
from ptxgen.runtime import ops

(m, k), t = (int(v) for v in sys.argv[1].split("x")), int(sys.argv[2])
plans = [tuple(int(v) for v in p.split(":")) for p in sys.argv[3].split(",")]
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 30
flag = r.DeviceArray.empty((1,), np.uint32)
for m, k, raw, ws in probe_weights(r, "q4_K", [(m, k)]):
    x = torch.randn(t, k, device="cuda", dtype=torch.float32)
    y = torch.empty(t, m, device="cuda", dtype=torch.float32)
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    ref = formats.gemm_ref("q4_K", raw, m, k, x.cpu().numpy())
    slots = r.load("mmq_q4_k_f16_n128", arch="sm_89").resident_per_sm() * r.current().sm_count
    out = [f"model {ops.splitk_plan_tail.__wrapped__(-(-t // 128) * -(-m // 128), k // 64, slots)}"]  # n128 (T > 64)
    for plan in plans:
        ops.splitk_plan_tail = lambda tiles, steps, slots, plan=plan: plan
        y.fill_(float("nan"))
        ops.mmq_launch(ws[0], xa, ya, t, flag, arch="sm_89", path="mma.sync")
        err = np.linalg.norm(y.cpu().numpy() - ref) / np.linalg.norm(ref)
        assert err <= 1e-3, f"{plan}: relative error {err:.2e}"
        us = timed(lambda i: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, arch="sm_89", path="mma.sync"), reps, torch)
        out.append(f"{plan} {us:.1f}")
    print(f"mma.sync {m}x{k} T={t}: " + ", ".join(out) + " us", flush=True)
