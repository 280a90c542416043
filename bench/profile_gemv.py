"""Run one decode GEMV op a few times (for ncu) and print its time: profile_gemv.py FMT M K T MODE [RULES [KNOBS]]
(default tq4_1s 18944 3584 1 exact; FMT tq4_1s, q4_K or q8_0, MODE exact or fast; RULES a JSON object of dispatch
rules to override, e.g. '{"xtab_max_tokens": {"tq4_1s": 1}}'; KNOBS kernel-choice knobs, NAME=VALUE[,NAME=VALUE],
e.g. PTXGEN_Q4K_FUSED=0: the prep + GEMV a graph runs rather than the eager one-launch build). Weights are random bytes
with small finite scales. Each op is 2 launches (prep, GEMV): `ncu -k regex:gemv --launch-skip 3 --launch-count 1`."""
import sys

import numpy as np

import ptxgen.runtime as r
from ptxgen import tuning

fmt = sys.argv[1] if len(sys.argv) > 1 else "tq4_1s"
m, k, t = (int(v) for v in (sys.argv[2:5] if len(sys.argv) >= 5 else (18944, 3584, 1)))
mode = sys.argv[5] if len(sys.argv) > 5 else "exact"
if len(sys.argv) > 6:
    import json

    tuning.set(**json.loads(sys.argv[6]))
if len(sys.argv) > 7:
    from ptxgen import knobs

    knobs.set(**knobs.parse(sys.argv[7].split(",")))
rng = np.random.default_rng(0)
bpb = {"tq4_1s": (32, 20), "q4_K": (256, 144), "q8_0": (32, 34)}[fmt]  # (weights, bytes) per block
raw = rng.integers(0, 256, (m, k // bpb[0], bpb[1]), dtype=np.uint8)
scales = raw[:, :, :4 if fmt != "q8_0" else 2].view(np.uint16)
scales[:] = np.float16(0.01).view(np.uint16)  # finite scales (TQ4_1S d0, d1; Q4_K d, dmin; Q8_0 d)
w = r.QuantTensor.from_raw(fmt, raw.reshape(m, -1), (m, k))
x = r.as_device_array(rng.standard_normal((t, k)).astype(np.float32))
for _ in range(3):
    r.mul_mat(w, x, mode=mode)
r.synchronize()
timer = r.Timer()
with timer:
    r.mul_mat(w, x, mode=mode)
print(f"{fmt} {m}x{k} T={t} {mode}: {timer.ms * 1e3:.1f} us (with host enqueue; use ncu for kernel times)", flush=True)
