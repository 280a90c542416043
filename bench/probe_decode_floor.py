"""Probe: the read floor of a decode loop with programmatic dependent launch — what #36's "% of the floor" should
be measured against. bench_op's decode loop timed a streaming kernel launched plainly in a CUDA graph (until
2026-12-02): every kernel's ramp and tail exposed. The GEMVs launch with PDL and load weights before they wait for
their input, so the next op's weight stream overlaps the previous op's tail. This times the same streaming kernel
(bench/probe_decode_floor.cu; its PTX, made with `nvcc -ptx -arch=sm_90a`, is probe_decode_floor.ptx) three ways
in a graph-replayed loop over distinct buffers: plain; PDL with the trigger at the head and the wait just before
the store (weights read while the previous kernel finishes: a GEMV's best case); PDL with the wait at the head (a
kernel that waits before it reads anything). Sizes: the decode weights of bench_model (MB).
Usage (repository root): python3 bench/probe_decode_floor.py [MB,MB,...]"""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

from bench_gemv import HBM  # noqa: E402
from bench_op import graphed  # noqa: E402
from ptxgen.runtime import driver  # noqa: E402
from ptxgen.runtime.compiler import compile_ptx  # noqa: E402

SIZES = (2.36, 9.44, 33.0, 48.2, 431.0)  # k / v, q / o, gate / up / down (Q4_K), down (Q6_K), output (Q6_K)
ENTRIES = ("read16_plain", "read16_pdl", "read16_pdl_wait_first")


def load():
    """{entry: Function} of the three streaming kernels (params p, n16 = bytes / 16, out)."""
    ptx = (Path(__file__).parent / "probe_decode_floor.ptx").read_text()
    mod = driver.Module(compile_ptx(ptx, "sm_90a", name="probe_decode_floor").cubin, "probe_decode_floor")
    params = [{"name": "p", "type": "u64"}, {"name": "n16", "type": "u64"}, {"name": "out", "type": "u64"}]
    return {e: mod.function(e, params, (256, 1, 1)) for e in ENTRIES}


def floor_fn(torch, buffers, nbytes: int, pdl: bool, per_sm: int = 4):
    """fn(i): the streaming kernel over buffers[i % len(buffers)] (device pointers of ≥ nbytes) on torch's current
    stream, with PDL (read, then wait, then store) or plainly: bench_op's decode-loop floor."""
    fns = load()
    fn = fns["read16_pdl" if pdl else "read16_plain"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(sms * 64, dtype=torch.int32, device="cuda")

    def run(i):
        fn.launch((sms * per_sm,), (buffers[i % len(buffers)], nbytes // 16, out.data_ptr()),
                  stream=torch.cuda.current_stream().cuda_stream, pdl=pdl)
    run.keep = (fns, out)
    return run


def main():
    sizes = [float(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else SIZES
    fns = load()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(sms * 64, dtype=torch.int32, device="cuda")
    print("| MB | CTAs/SM | plain µs (% of 4.27 TB/s) | PDL, wait before the store | PDL, wait at the head |")
    print("|---|---|---|---|---|")
    for mb in sizes:
        n = int(mb * 1e6) // 16 * 4
        copies = max(24, math.ceil(4 * 60e6 / (4 * n)))
        copies = min(copies, max(2, int(20e9 // (4 * n))))
        bufs = [torch.randn(n, device="cuda") for _ in range(copies)]
        nb = 4 * n
        for per_sm in (2, 4, 8):
            cells = []
            for e in ENTRIES:
                fn, pdl = fns[e], e != "read16_plain"

                def run(i, fn=fn, pdl=pdl, bufs=bufs):
                    fn.launch((sms * per_sm,), (bufs[i % copies].data_ptr(), nb // 16, out.data_ptr()),
                              stream=torch.cuda.current_stream().cuda_stream, pdl=pdl)
                run(0)
                us = graphed(torch, run, calls=4 * copies if copies <= 48 else copies)
                cells.append(f"{us:.1f} ({nb / (us * 1e-6) / HBM:.0%})")
            print(f"| {nb / 1e6:.1f} | {per_sm} | " + " | ".join(cells) + " |", flush=True)
        del bufs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
