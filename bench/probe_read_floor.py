"""Probe: the practical floor for reading N bytes in one kernel on this GPU, launch and ramp included — a plain
streaming kernel (probe_decode_floor's read16_plain: 16-byte loads, 4 in flight per thread, grid-stride over
the SMs, an xor per block written so nothing is dead code) and a torch copy of N bytes (read + write); buffers
rotated past the L2, bench_gemv's timing: probe_read_floor.py MB,MB,... [reps]. The GEMVs' weight bytes per op set N (Q4_K
4096x14336: 33.0 MB, TQ4_1S 18944x3584: 42.4 MB): "% of roofline" is against 4.27 TB/s; this says what a
kernel that only streams that many bytes reaches."""
import math
import sys

import torch

from bench_gemv import timed
from probe_decode_floor import load



def main():
    sizes = [float(v) for v in sys.argv[1].split(",")]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    kern = load()["read16_plain"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(sms * 64, dtype=torch.int32, device="cuda")
    for mb in sizes:
        n = int(mb * 1e6) // 16 * 4  # fp32 elements, a multiple of 4
        copies = max(2, math.ceil(4 * 60e6 / (4 * n)))
        bufs = [torch.randn(n, device="cuda") for _ in range(copies)]
        dst = [torch.empty(n, device="cuda") for _ in range(copies)]
        nb = 4 * n
        res = []
        for blocks_per_sm in (4, 8, 16):
            def run(i, bps=blocks_per_sm):
                kern.launch((sms * bps,), (bufs[i % copies].data_ptr(), nb // 16, out.data_ptr()),
                            stream=torch.cuda.current_stream().cuda_stream)
            run(0)
            us = timed(run, reps, torch)
            res.append(f"{blocks_per_sm}/SM {us:.1f} us ({nb / us / 4.27e6:.0%})")
        c = timed(lambda i: dst[i % copies].copy_(bufs[(i + 1) % copies]), reps, torch)
        print(f"{nb / 1e6:.1f} MB: read kernel " + ", ".join(res) +
              f"; torch copy {c:.1f} us ({2 * nb / c / 1e3:.0f} GB/s read+write)", flush=True)


if __name__ == "__main__":
    main()
