"""Launch the wgmma MMQ on one large shape per token tile (for ncu), and print the time of each."""
import sys

import numpy as np

import ptxgen.runtime as r
from ptxgen.runtime import ops

m, k, t = (int(v) for v in (sys.argv[1:4] if len(sys.argv) >= 4 else (14336, 4096, 4096)))
rng = np.random.default_rng(0)
raw = rng.integers(0, 256, (m, k // 256 * 144), dtype=np.uint8)
raw.view(np.uint16)[:, 0] = np.float16(0.01).view(np.uint16)  # d
raw.view(np.uint16)[:, 1] = np.float16(0.001).view(np.uint16)  # dmin
w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
x = r.as_device_array(rng.standard_normal((t, k)).astype(np.float32))
y = r.DeviceArray.empty((t, m), np.float32)
flag = r.DeviceArray.empty((1,), np.uint32)
for bn in [int(v) for v in (sys.argv[4:] or ops.WGMMA_TILES)]:
    ops.mmq_launch(w, x, y, t, flag, bn=bn, path="wgmma")
    r.synchronize()
    timer = r.Timer()
    with timer:
        ops.mmq_launch(w, x, y, t, flag, bn=bn, path="wgmma")
    print(f"{m}x{k} T={t} bn={bn}: {timer.ms * 1e3:.1f} us (includes convert_f16 and the launch calls)", flush=True)
