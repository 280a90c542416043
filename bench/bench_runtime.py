"""Runtime costs (needs a GPU): cold start of a cached kernel in a fresh process, and launch overhead per
call against a bare cuLaunchKernel of the same cubin. Prints a table; writes JSON to --out."""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

COLD = r"""
import time, numpy as np
import ptxgen.runtime as r
r.current()                      # CUDA context creation is excluded
x = np.ones((1, 32), np.float32)
t0 = time.perf_counter(); fn = r.load("quantize_q8_1"); t1 = time.perf_counter()
print((t1 - t0) * 1e3)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import ptxgen.runtime as r
    from ptxgen.runtime.driver import _drv, check

    r.load("quantize_q8_1")  # warm the disk cache
    colds = [float(subprocess.run([sys.executable, "-c", COLD], capture_output=True, text=True, check=True,
                                  env=dict(os.environ)).stdout.strip()) for _ in range(3)]
    x = r.DeviceArray.empty((1, 32), np.float32)
    y = r.DeviceArray.empty((1, 36), np.uint8)
    fn = r.load("quantize_q8_1")
    n = 2000
    for _ in range(50):
        fn.launch((1,), (x, y, 1))
    r.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn.launch((1,), (x, y, 1))
    r.synchronize()
    ours = (time.perf_counter() - t0) / n * 1e6
    drv = _drv()
    storage, params = fn.pack((x, y, 1))
    t0 = time.perf_counter()
    for _ in range(n):
        check(drv.cuLaunchKernel(fn.handle, 1, 1, 1, 256, 1, 1, 0, 0, params, 0))
    r.synchronize()
    bare = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for _ in range(n // 4):
        r.quantize_q8_1(x, out=y)
    r.synchronize()
    op = (time.perf_counter() - t0) / (n // 4) * 1e6
    res = {"cold_start_ms": colds, "launch_us_ptxgen": ours, "launch_us_bare": bare, "op_us_quantize_q8_1": op}
    print("| what | value |\n|---|---|")
    print(f"| cold start, cached kernel, fresh process (ms; 3 runs) | {', '.join(f'{c:.1f}' for c in colds)} |")
    print(f"| Function.launch per call (µs) | {ours:.2f} |")
    print(f"| bare cuLaunchKernel per call (µs) | {bare:.2f} |")
    print(f"| quantize_q8_1 op incl. checks (µs) | {op:.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
