"""Why an op's graph-replayed time at T = 4096 exceeds its isolated kernel time: SM clock and power sampled by
nvidia-smi while (a) one mul_mat runs behind a sleep, repeatedly (the isolated kernel-only method) and (b) a graph
of 100 back-to-back calls replays (the graph method), for Q4_K 4096×14336 T=4096 and cuBLAS fp16 beside it.
Prints median clock / power / per-call µs of each. Needs a GPU, torch and nvidia-smi."""
import statistics
import subprocess
import time

import numpy as np


def sampled(fn, seconds):
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    t0 = time.time()
    per = []
    while time.time() - t0 < seconds:
        per.append(fn())
    smi.terminate()
    rows = [tuple(float(v) for v in line.split(",")) for line in smi.stdout.read().splitlines() if "," in line]
    rows = rows[len(rows) // 4:]  # past the ramp
    return statistics.median(per), statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)


def main():
    import torch
    import torch.nn.functional as F

    import ptxgen.runtime as r
    from ptxgen.testing.strategies import random_raw

    m, k, t = 4096, 14336, 4096
    w = r.QuantTensor.from_raw("q4_K", random_raw("q4_K", m, k, np.random.default_rng(0)), (m, k)).to_device()
    x, y = torch.randn(t, k, device="cuda"), torch.empty(t, m, device="cuda")
    w16, xh = torch.randn(m, k, device="cuda", dtype=torch.float16), x.half()
    for name, op in (("ptxgen q4_K", lambda: r.mul_mat(w, x, out=y)), ("cuBLAS fp16", lambda: F.linear(xh, w16))):
        op()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def isolated():
            torch.cuda._sleep(1_000_000)
            a.record()
            op()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) * 1e3

        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(100):
                op()

        def replay():
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) * 1e3 / 100

        for how, fn in (("isolated", isolated), ("graph", replay)):
            us, mhz, watts = sampled(fn, 4.0)
            print(f"| {name} | {how} | {us:.1f} µs | {mhz:.0f} MHz | {watts:.0f} W |", flush=True)


if __name__ == "__main__":
    main()
