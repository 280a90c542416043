"""Launch the Q8_1 MMQ (path q8 or q8_pre) on one shape, for ncu; print the time of each launch."""
import sys

import numpy as np

import ptxgen.runtime as r
from ptxgen.runtime import ops

m, k, t = (int(v) for v in (sys.argv[1:4] if len(sys.argv) >= 4 else (4096, 14336, 16)))
paths = sys.argv[4:] or ["q8_pre"]
rng = np.random.default_rng(0)
raw = rng.integers(0, 256, (m, k // 256 * 144), dtype=np.uint8)
raw.view(np.uint16)[:, 0] = np.float16(0.01).view(np.uint16)  # d
raw.view(np.uint16)[:, 1] = np.float16(0.001).view(np.uint16)  # dmin
w = r.QuantTensor.from_raw("q4_K", raw, (m, k))
x = r.as_device_array(rng.standard_normal((t, k)).astype(np.float32))
y = r.DeviceArray.empty((t, m), np.float32)
flag = r.DeviceArray.empty((1,), np.uint32)
for path in paths:
    for _ in range(3):
        ops.mmq_launch(w, x, y, t, flag, path=path)
    r.synchronize()
    timer = r.Timer()
    with timer:
        ops.mmq_launch(w, x, y, t, flag, path=path)
    print(f"{m}x{k} T={t} {path}: {timer.ms * 1e3:.1f} us (all launches of the op)", flush=True)
