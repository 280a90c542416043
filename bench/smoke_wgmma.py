"""One MMQ call per lowering and token tile on small shapes (split-K included: every lowering sums its partials
in the kernel), checked against the reference; run under `timeout` before the GPU tier so
that a pipeline deadlock costs seconds, not the whole device call, and under compute-sanitizer racecheck /
synccheck. Paths: argv (default: wgmma wgmma_ra wgmma_ra_cx wgmma_pre_x16 wgmma_pre_cx q8 q8_pre mma.sync mma.sync_x16;
wgmma_ra_cx: the register-A build converting x inside the launch; wgmma_pre_*: the prepared build,
dequantize_q4_k_frags first)."""
import sys

import numpy as np

import ptxgen.runtime as r
from ptxgen import formats
from ptxgen.runtime import ops

rng = np.random.default_rng(0)
ok = True
TILES = {"wgmma": ops.WGMMA_TILES, "wgmma_ra": ops.WGMMA_RA_TILES, "wgmma_ra_cx": (128, 256),
         "wgmma_pre_x16": (256,), "wgmma_pre_cx": (256,), "q8": ops.Q8_TILES, "q8_pre": ops.Q8_TILES, "mma.sync": ops.MMQ_TILES,
         "mma.sync_x16": ops.MMQ_TILES}
for path in sys.argv[1:] or list(TILES):
    for (m, k, t) in [(128, 256, 32), (256, 1024, 100), (300, 4096, 64)]:
        raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
        x = rng.standard_normal((t, k)).astype(np.float32)
        w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
        ref = formats.gemm_q8_1_ref if path.startswith("q8") else formats.gemm_ref
        want = ref("q4_K", raw, m, k, x)
        for bn in TILES[path]:
            out = r.DeviceArray.empty((t, m), np.float32)
            out.owner.fill_bytes(0xFF)
            flag = r.DeviceArray.empty((1,), np.uint32)
            flag.owner.fill_bytes(0)
            ops.mmq_launch(w, r.as_device_array(x), out, t, flag, bn=bn, path=path)
            got = out.numpy()
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            nan = int(np.isnan(got).sum())
            print(f"{path} m={m} k={k} t={t} bn={bn}: rel err {err:.3g}, NaN {nan}", flush=True)
            ok &= bool(err <= (1e-5 if path.startswith("q8") else 1e-3) and nan == 0)
sys.exit(0 if ok else 1)
