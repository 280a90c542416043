"""Launch the TQ4_1S decode GEMVs (exact and fast) on one shape (for ncu) and print each op's time.
usage: python3 bench/profile_gemv.py [M K T]"""
import sys

import numpy as np

import ptxgen.runtime as r

m, k, t = (int(v) for v in (sys.argv[1:4] if len(sys.argv) >= 4 else (18944, 3584, 1)))
rng = np.random.default_rng(0)
raw = rng.integers(0, 256, (m, k // 32 * 20), dtype=np.uint8)
raw.reshape(m, -1, 20)[:, :, 0:4] = np.frombuffer(np.float16([0.01, 0.02]).tobytes(), np.uint8)
w = r.QuantTensor.from_raw("tq4_1s", raw, (m, k))
x = r.as_device_array(rng.standard_normal((t, k)).astype(np.float32))
y = r.DeviceArray.empty((t, m), np.float32)
for mode in ("exact", "fast"):
    for _ in range(3):
        r.mul_mat(w, x, out=y, mode=mode)
    r.synchronize()
    timer = r.Timer()
    with timer:
        r.mul_mat(w, x, out=y, mode=mode)
    print(f"{m}x{k} T={t} {mode}: {timer.ms * 1e3:.1f} us (with host enqueue)", flush=True)
