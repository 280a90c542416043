"""Probe: power and clocks under a sustained loop of one op (needs a GPU, torch and nvidia-smi). A prefill GEMM at
T = 4096 runs at the GPU's power limit in a loop, where its time is set by the energy it spends an op, not by its
isolated kernel time (#34's Q8_0 4096x14336 cell: 710 µs isolated, 819 busy in the loop; cuBLAS fp16 ~710 both).
For each case: the µs per call over a loop of ≥ 0.5 s, nvidia-smi's power draw and SM clock sampled every 20 ms
while it runs (the first 100 ms dropped: the ramp), and the energy an op (mean W x µs).

  python3 bench/probe_power.py [--shape 4096x14336] [--tokens 4096] [--seconds 1.0]

Cases: cuBLAS fp16 F.linear; mul_mat Q8_0 on fp32 x and on fp16 x; Q8_0 with its register-A decode replaced by
A = 1.0 (mmq.RA_NODECODE: the tensor cores and the data movement alone, wrong values); Q4_K on fp32 x."""
import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

from bench_gemv import need_torch  # noqa: E402

QUERY = "{power},clocks.sm,clocks.mem,temperature.gpu,power.limit"


def power_field() -> str:
    """nvidia-smi's instantaneous power reading where the driver has it (R535+): power.draw averages over a second on
    Hopper, which smears a 1-s loop's edges into its mean (2026-12-07: means of 430-630 W against 700-W maxima)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=power.draw.instant", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True)
    try:
        float(out.stdout.strip().splitlines()[0])
        return "power.draw.instant"
    except (ValueError, IndexError):
        return "power.draw"


def sample_while(torch, fn, seconds: float):
    """Run fn(i) back to back for ~`seconds` while nvidia-smi samples; → (µs per call, [samples])."""
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(0)
    torch.cuda.synchronize()
    n = max(20, int(seconds / max(time.perf_counter() - t0, 1e-5)))
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY.format(power=power_field())}", "--format=csv,noheader,nounits",
                            "-lms", "20"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.15)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(n):
        fn(i)
    end.record()
    end.synchronize()
    smi.terminate()
    out, _ = smi.communicate()
    rows = [[float(v) for v in line.split(",")] for line in out.strip().splitlines() if line.strip()]
    return start.elapsed_time(end) * 1e3 / n, rows[7:-3] or rows  # (drop the idle lead-in, the ramp and the tail)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096x14336")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    torch = need_torch()
    import torch.nn.functional as F

    import ptxgen.runtime as r
    from ptxgen.testing.strategies import random_raw

    m, k = (int(v) for v in args.shape.split("x"))
    t = args.tokens
    rng = np.random.default_rng(0)
    x = torch.randn(t, k, device="cuda")
    xh = x.half()
    y = torch.empty(t, m, device="cuda")
    w16 = [torch.randn(m, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(2)]
    wq = {f: [r.QuantTensor.from_raw(f, random_raw(f, m, k, rng), (m, k)).to_device() for _ in range(2)]
          for f in ("q8_0", "q4_K")}
    cases = [("cuBLAS fp16 F.linear", lambda i: F.linear(xh, w16[i % 2])),
             ("q8_0 fp32 x", lambda i: r.mul_mat(wq["q8_0"][i % 2], x, out=y)),
             ("q8_0 fp16 x", lambda i: r.mul_mat(wq["q8_0"][i % 2], xh, out=y)),
             ("q8_0 fp32 x, no decode (A = 1.0)", "nodec"),
             ("q4_K fp32 x", lambda i: r.mul_mat(wq["q4_K"][i % 2], x, out=y))]
    print(f"{torch.cuda.get_device_name()}: {m}x{k} T = {t}, loops of ~{args.seconds} s; nvidia-smi every 20 ms")
    print("| case | µs per call | power W mean / max (limit) | SM MHz mean / min | mem MHz | °C | energy mJ an op |")
    print("|---|---|---|---|---|---|---|")
    for label, fn in cases:
        old = None
        if fn == "nodec":
            from probe_build_ab import restore, swap
            from ptxgen.kernels import mmq

            from ptxgen.runtime import kernels

            names = [n for n in kernels.manifest("sm_90a") if n in ("mmq_q8_0_wgmma_ra_n256", "mmq_q8_0_wgmma_ra_n256_cx")]
            old = swap(names, [(mmq, "RA_NODECODE", True)])
            for w in wq["q8_0"]:
                w._plans.clear()
            fn = lambda i: r.mul_mat(wq["q8_0"][i % 2], x, out=y)  # noqa: E731
        try:
            us, rows = sample_while(torch, fn, args.seconds)
        finally:
            if old is not None:
                restore(old)
                for w in wq["q8_0"]:
                    w._plans.clear()
        a = np.array(rows)
        p, c, mc, tc, lim = (a[:, i] for i in range(5))
        print(f"| {label} | {us:.1f} | {p.mean():.0f} / {p.max():.0f} ({lim.max():.0f}) | {c.mean():.0f} / {c.min():.0f} "
              f"| {mc.mean():.0f} | {tc.mean():.0f} | {p.mean() * us * 1e-3:.0f} |", flush=True)


if __name__ == "__main__":
    main()
