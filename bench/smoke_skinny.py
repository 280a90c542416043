"""The register-A skinny GEMMs (mmq_q4_k_rega_n16 / _n32) once each on small shapes — split-K and two token groups
included — checked against the float64 reference; small enough to run under compute-sanitizer racecheck /
synccheck (their records' ring is shared by the CTA's warps behind one bar.sync per step). Usage: smoke_skinny.py"""
import numpy as np

import ptxgen.runtime as r
from ptxgen import formats
from ptxgen.runtime import ops

rng = np.random.default_rng(0)
ok = True
for c, m, k, t in ((16, 520, 2048, 13), (16, 300, 1024, 32), (32, 520, 2048, 45)):
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    xa = r.as_device_array(x, "x", np.float32, ndim=2)
    out = r.DeviceArray.empty((t, m), np.float32)
    out.owner.fill_bytes(0xFF)
    ops._skinny_gemm(w, xa.ptr, out.ptr, m, k, t, "sm_90a", c=c)
    got, want = out.numpy(), formats.gemm_ref("q4_K", raw, m, k, x)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    ok &= bool(np.isfinite(got).all() and err <= 1e-3)
    print(f"mmq_q4_k_rega_n{c} {m}x{k} T={t}: relative error {err:.2e}", flush=True)
raise SystemExit(0 if ok else 1)
