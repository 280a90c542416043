"""Probe: the read floor of a decode loop with programmatic dependent launch — what #36's "% of the floor" should
be measured against. bench_op's decode loop timed a streaming kernel launched plainly in a CUDA graph (until
2026-12-02): every kernel's ramp and tail exposed. The GEMVs launch with PDL and load weights before they wait for
their input, so the next op's weight stream overlaps the previous op's tail. This times the same streaming kernel
(bench/probe_decode_floor.cu; its PTX, made with `nvcc -ptx -arch=sm_90a`, is probe_decode_floor.ptx) three ways
in a graph-replayed loop over distinct buffers: plain; PDL with the trigger at the head and the wait just before
the store (weights read while the previous kernel finishes: a GEMV's best case); PDL with the wait at the head (a
kernel that waits before it reads anything). Sizes: the decode weights of bench_model (MB).
Usage (repository root): python3 bench/probe_decode_floor.py [MB,MB,...]
   or: python3 bench/probe_decode_floor.py rows [MxK:splits,...] — the GEMV's access pattern (Q4_K rows: 16 rows x
one 144-byte super-block a warp step, gemv_q4_k_mma_t1's grid) beside the same bytes repacked tile-contiguous and
the grid-stride stream, all with PDL: is the gap to the floor the GGUF row layout's access pattern?
   or: python3 bench/probe_decode_floor.py smem [MxK:splits,...] [KB,...] — the row pattern with each CTA holding
that much unused dynamic shared memory (the GEMV's 4 x 54 KB an SM: does it block the next op's early start?)"""
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
ROW_ENTRIES = ("rows_pdl", "tiled_pdl")
ROW_CASES = "4096x14336:8,14336x4096:2,4096x4096:8,1024x4096:8"  # gemv_q4_k_mma_t1's K splits on the H200


def load():
    """{entry: Function} of the three streaming kernels (params p, n16 = bytes / 16, out) and the two row-pattern
    ones (params w, m, nsb, blk16, out; 128 threads)."""
    ptx = (Path(__file__).parent / "probe_decode_floor.ptx").read_text()
    mod = driver.Module(compile_ptx(ptx, "sm_90a", name="probe_decode_floor").cubin, "probe_decode_floor")
    params = [{"name": "p", "type": "u64"}, {"name": "n16", "type": "u64"}, {"name": "out", "type": "u64"}]
    fns = {e: mod.function(e, params, (256, 1, 1)) for e in ENTRIES}
    rp = [{"name": "w", "type": "u64"}, {"name": "m", "type": "u32"}, {"name": "nsb", "type": "u32"},
          {"name": "blk16", "type": "u32"}, {"name": "out", "type": "u64"}]
    fns.update({e: mod.function(e, rp, (128, 1, 1)) for e in ROW_ENTRIES})
    return fns


def _row_case(case: str):
    """"MxK:splits" → (m, super-blocks a row, 16-byte chunks a block, K splits, bytes, copies, the copies' buffers):
    Q4_K's 144-byte blocks, enough distinct buffers (≥ 24, ≥ 240 MB) that the loop reads from HBM."""
    shape, splits = case.split(":")
    m, k = map(int, shape.split("x"))
    nsb, blk16 = k // 256, 9
    nb = m * nsb * blk16 * 16
    copies = max(24, math.ceil(240e6 / nb))
    bufs = [torch.randint(-2**31, 2**31 - 1, (nb // 4,), dtype=torch.int32, device="cuda") for _ in range(copies)]
    return m, nsb, blk16, int(splits), nb, copies, bufs


def rows(cases: str):
    """µs per op of the row-pattern kernels and the grid-stride stream over the same bytes, graph-replayed over
    24+ distinct weights, with PDL."""
    fns = load()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    print("| M x K (Q4_K) | MB | K splits | rows, GGUF layout µs (% HBM) | rows, tile-contiguous | grid-stride stream |")
    print("|---|---|---|---|---|---|")
    for case in cases.split(","):
        m, nsb, blk16, splits, nb, copies, bufs = _row_case(case)
        cells = []
        for e in ROW_ENTRIES:
            def run(i, fn=fns[e], bufs=bufs):
                fn.launch((-(-m // 64), splits), (bufs[i % copies].data_ptr(), m, nsb, blk16, out.data_ptr()),
                          stream=torch.cuda.current_stream().cuda_stream, pdl=True)
            run(0)
            cells.append(graphed(torch, run, calls=4 * copies))

        def stream(i, fn=fns["read16_pdl"], bufs=bufs):
            fn.launch((sms * 4,), (bufs[i % copies].data_ptr(), nb // 16, out.data_ptr()),
                      stream=torch.cuda.current_stream().cuda_stream, pdl=True)
        stream(0)
        cells.append(graphed(torch, stream, calls=4 * copies))
        print(f"| {m} x {nsb * 256} | {nb / 1e6:.1f} | {splits} | " +
              " | ".join(f"{us:.1f} ({nb / (us * 1e-6) / HBM:.0%})" for us in cells) + " |", flush=True)
        del bufs
        torch.cuda.empty_cache()


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


def smem(cases: str, kbs: str):
    """The row-pattern kernel (GGUF layout) in the same graph-replayed PDL loop, each CTA holding `kb` KB of dynamic
    shared memory it never touches: does a GEMV's shared-memory footprint (gemv_q4_k_mma_t1: 4 CTAs an SM of 54 KB)
    cost the overlap of consecutive ops that PDL gives a kernel whose next launch can be resident at once?"""
    fns = load()
    fn = fns["rows_pdl"]
    out = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    sizes = [int(float(v) * 1024) for v in kbs.split(",")]
    print("| M x K (Q4_K) | K splits | " + " | ".join(f"{b / 1024:g} KB smem a CTA µs (% HBM)" for b in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for case in cases.split(","):
        m, nsb, blk16, splits, nb, copies, bufs = _row_case(case)
        cells = []
        for nbytes in sizes:
            if nbytes:
                fn.set_dynamic_smem(nbytes)

            def run(i, bufs=bufs, nbytes=nbytes):
                fn.launch((-(-m // 64), splits), (bufs[i % copies].data_ptr(), m, nsb, blk16, out.data_ptr()),
                          smem=nbytes, stream=torch.cuda.current_stream().cuda_stream, pdl=True)
            run(0)
            us = graphed(torch, run, calls=4 * copies)
            cells.append(f"{us:.1f} ({nb / (us * 1e-6) / HBM:.0%})")
        print(f"| {m} x {nsb * 256} | {splits} | " + " | ".join(cells) + " |", flush=True)
        del bufs
        torch.cuda.empty_cache()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "rows":
        return rows(sys.argv[2] if len(sys.argv) > 2 else ROW_CASES)
    if len(sys.argv) > 1 and sys.argv[1] == "smem":
        return smem(sys.argv[2] if len(sys.argv) > 2 else "4096x14336:8,4096x4096:8",
                    sys.argv[3] if len(sys.argv) > 3 else "0,13.5,27,41,54")
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
