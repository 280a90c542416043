"""Launch an MMQ lowering on one shape (for ncu) and print the time of each launch: profile_mmq.py M K T PATH
[BN ...] with PATH wgmma, wgmma_ra, mma.sync, q8 or q8_pre (default 14336 4096 4096 wgmma, every token tile)."""
import sys

import numpy as np

import ptxgen.runtime as r
from ptxgen.runtime import ops

m, k, t = (int(v) for v in (sys.argv[1:4] if len(sys.argv) >= 4 else (14336, 4096, 4096)))
path = sys.argv[4] if len(sys.argv) >= 5 else "wgmma"
tiles = {"wgmma": ops.WGMMA_TILES, "wgmma_ra": ops.WGMMA_RA_TILES, "mma.sync": ops.MMQ_TILES}.get(path, ops.Q8_TILES)
rng = np.random.default_rng(0)
raw = rng.integers(0, 256, (m, k // 256 * 144), dtype=np.uint8)
raw.view(np.uint16)[:, 0] = np.float16(0.01).view(np.uint16)  # d
raw.view(np.uint16)[:, 1] = np.float16(0.001).view(np.uint16)  # dmin
w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
x = r.as_device_array(rng.standard_normal((t, k)).astype(np.float32))
y = r.DeviceArray.empty((t, m), np.float32)
flag = r.DeviceArray.empty((1,), np.uint32)
for bn in [int(v) for v in sys.argv[5:]] or tiles:
    ops.mmq_launch(w, x, y, t, flag, bn=bn, path=path)
    r.synchronize()
    timer = r.Timer()
    with timer:
        ops.mmq_launch(w, x, y, t, flag, bn=bn, path=path)
    print(f"{m}x{k} T={t} {path} bn={bn}: {timer.ms * 1e3:.1f} us (all launches of the op)", flush=True)
