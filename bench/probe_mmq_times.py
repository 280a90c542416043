"""Probe: device times of the Q4_K MMQ launch (no flag readback) per path, e.g. to compare kernel variants emitted
into PTXGEN_EMITTED_DIR: probe_mmq_times.py PATH MxK,MxK,... T,T,... [reps] (PATH wgmma, wgmma_ra or mma.sync; PROBE_BN pins the token tile). Each shape
is checked against the float64 reference (1e-3) at its smallest T first. bench_mmq's timing (weights from HBM)."""
import os

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_weights, timed
from ptxgen import formats
from ptxgen.runtime.ops import mmq_launch

path, shapes, tokens, reps = probe_argv(30)
if os.environ.get("PROBE_JIT") == "driver":  # wgmma kernels JIT-compiled by the driver from PTX (whole program:
    from ptxgen.runtime import compiler, kernels  # setmaxnreg honoured), not nvJitLink (relocatable: ignored)

    nvjitlink = kernels.compile_ptx

    def driver_jit(ptx, target, options=(), name="kernel"):
        if "wgmma" not in name:
            return nvjitlink(ptx, target, options, name)
        return compiler.CompileResult(ptx.encode() + b"\0", target, "driver JIT")
    kernels.compile_ptx = driver_jit
bn = int(os.environ["PROBE_BN"]) if os.environ.get("PROBE_BN") else None
flag = r.DeviceArray.empty((1,), np.uint32)
for m, k, raw, ws in probe_weights(r, "q4_K", shapes):
    copies = len(ws)
    out = []
    for i, t in enumerate(tokens):
        x = torch.randn(t, k, device="cuda", dtype=torch.float32)
        y = torch.empty(t, m, device="cuda", dtype=torch.float32)
        xa, ya = r.as_device_array(x), r.as_device_array(y)
        if i == 0:
            flag.owner.fill_bytes(0)
            y.fill_(float("nan"))  # poison: unwritten outputs fail the check
            mmq_launch(ws[0], xa, ya, t, flag, bn=bn, path=path)
            ref = formats.gemm_ref("q4_K", raw, m, k, x.cpu().numpy())
            err = np.linalg.norm(y.cpu().numpy() - ref) / np.linalg.norm(ref)
            assert err <= 1e-3, f"{path} {m}x{k} T={t}: relative error {err:.2e}"
        out.append(f"T={t} {timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag, bn=bn, path=path), reps, torch):.1f}")
    print(f"{path}{'' if bn is None else f' n{bn}'} {m}x{k}: " + ", ".join(out) + " us", flush=True)
