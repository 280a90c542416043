"""One wgmma MMQ call per token tile on a small shape, checked against the reference; run under `timeout`
before the GPU tier so that a pipeline deadlock costs seconds, not the whole device call."""
import sys

import numpy as np

import ptxgen.runtime as r
from ptxgen import formats
from ptxgen.runtime import ops

rng = np.random.default_rng(0)
ok = True
for (m, k, t) in [(128, 256, 32), (256, 1024, 100), (300, 4096, 64)]:
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
    want = formats.gemm_ref("q4_K", raw, m, k, x)
    for bn in ops.WGMMA_TILES:
        out = r.DeviceArray.empty((t, m), np.float32)
        out.owner.fill_bytes(0xFF)
        flag = r.DeviceArray.empty((1,), np.uint32)
        flag.owner.fill_bytes(0)
        ops.mmq_launch(w, r.as_device_array(x), out, t, flag, bn=bn, path="wgmma")
        got = out.numpy()
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        nan = int(np.isnan(got).sum())
        print(f"m={m} k={k} t={t} bn={bn}: rel err {err:.3g}, NaN {nan}", flush=True)
        ok &= bool(err <= 1e-3 and nan == 0)
sys.exit(0 if ok else 1)
