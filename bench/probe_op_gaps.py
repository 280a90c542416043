"""Where a loop of back-to-back mul_mat calls spends the time its kernels do not (needs a GPU and torch): one
replay of `--calls` captured calls (and one eager loop) under CUPTI, then per op the kernels' start / end offsets
and the idle gaps between consecutive kernels, and the totals: events µs per call, the kernels' union (busy), the
summed gaps by kind (kernel a -> kernel b). #32's graph ÷ kernel-only at T = 4096 is this gap over the kernel time.

usage: python bench/probe_op_gaps.py --fmt q4_K --shape 4096x4096 --tokens 4096 [--calls 50] [--show 2]
       python bench/probe_op_gaps.py --fmt q4_K --shape 4096x4096 --tokens 1 --weights 16   (a decode loop from HBM)
       python bench/probe_op_gaps.py --fmt q4_K --moe 128:8 --shape 768x2048 --tokens 32,512   (mul_mat_id: M x K
       an expert's; ids drawn per token without repeats)
       python bench/probe_op_gaps.py --ops q4_K:4096x4096,q4_K:1024x4096,q6_K:1024x4096 --tokens 1 --weights 4
       (a sequence of different ops in turn, as a layer's: x shared by the ops of one K; --calls counts ops)
"""
import argparse
from collections import defaultdict

import numpy as np


def timeline(torch, prof):
    """The profiled kernels as (start µs, end µs, name), in start order (bench_op's lead sleep left out)."""
    return sorted((ev.time_range.start, ev.time_range.end, ev.name) for ev in prof.events()
                  if ev.device_type == torch.autograd.DeviceType.CUDA and "spin_kernel" not in ev.name)


def report(label, evs, calls, elapsed_us, show):
    """Per call: events µs, the kernels' union (busy), the gaps between consecutive kernels by kind; then `show`
    kernels of the timeline from its middle."""
    if not evs:
        print(f"\n{label}: no kernels recorded")
        return
    from bench_op import span_union

    gaps, prev = defaultdict(list), None
    for s, e, n in evs:
        if prev is not None:
            gaps[(prev[2], n)].append(s - prev[1])
        prev = (s, e, n)
    busy = span_union((s, e) for s, e, _ in evs)
    print(f"\n{label}: {elapsed_us / calls:.1f} µs per call (events), busy {busy / calls:.1f}, "
          f"{len(evs) / calls:.2f} kernels a call")
    durs = defaultdict(list)
    for s, e, n in evs:
        durs[n].append(e - s)
    for n, d in sorted(durs.items(), key=lambda kv: -sum(kv[1])):
        d = np.array(d)
        print(f"  kernel {n[:60]:60s} n={len(d):4d} µs median {np.median(d):7.2f} (per call {d.sum() / calls:.2f})")
    for (a, b), g in sorted(gaps.items(), key=lambda kv: -sum(kv[1])):
        g = np.array(g)
        print(f"  {a[:40]:40s} -> {b[:40]:40s} n={len(g):4d} gap µs median {np.median(g):7.2f} "
              f"min {g.min():7.2f} max {g.max():7.2f} (per call {g.sum() / calls:.2f})")
    t0 = evs[len(evs) // 2][0]
    mid = len(evs) // 2
    for s, e, n in evs[mid:mid + show]:
        print(f"    {s - t0:10.1f} .. {e - t0:10.1f}  ({e - s:8.1f})  {n[:70]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmt", default="q4_K")
    ap.add_argument("--shape", default="4096x4096")
    ap.add_argument("--tokens", default="4096")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--show", type=int, default=6, help="kernels of the timeline printed (from the middle)")
    ap.add_argument("--weights", type=int, default=4, help="distinct weights the loop rotates over (more than the "
                    "60 MB L2 holds, for decode shapes: 16 for 4096x4096 Q4_K)")
    ap.add_argument("--moe", default=None, metavar="E:TOP", help="time mul_mat_id over E experts, TOP a token")
    ap.add_argument("--x-dtype", default="float32", choices=("float32", "float16"), help="the activations' dtype")
    ap.add_argument("--ops", default=None, metavar="FMT:MxK,...", help="a sequence of mul_mat ops in turn (each with "
                    "--weights copies; --fmt and --shape unused)")
    args = ap.parse_args()
    import torch

    import ptxgen.runtime as r
    from ptxgen.testing.strategies import random_raw

    from bench_op import _capture, lead

    m, k = (int(v) for v in args.shape.split("x"))
    e, top = map(int, args.moe.split(":")) if args.moe else (1, 1)
    rng = np.random.default_rng(0)
    seq = [(f, *(int(v) for v in s.split("x"))) for f, s in (o.split(":") for o in args.ops.split(","))] \
        if args.ops else None
    if seq:  # each op's --weights copies of one random weight (the loop reads them from HBM)
        wseq = [[r.QuantTensor.from_raw(f, raw, (mm, kk)).to_device() for _ in range(args.weights)]
                for f, mm, kk, raw in ((f, mm, kk, random_raw(f, mm, kk, rng)) for f, mm, kk in seq)]
    else:
        raw = random_raw(args.fmt, e * m, k, rng)
        ws = [r.QuantTensor.from_raw(args.fmt, raw, (e, m, k) if args.moe else (m, k)).to_device()
              for _ in range(args.weights)]
    for t in (int(v) for v in args.tokens.split(",")):
        x = torch.randn(t, k, device="cuda", dtype=getattr(torch, args.x_dtype))
        if seq:
            xs = {kk: torch.randn(t, kk, device="cuda", dtype=getattr(torch, args.x_dtype)) for _, _, kk in seq}
            ys = [torch.empty(t, mm, device="cuda") for _, mm, _ in seq]
            fn = lambda i: r.mul_mat(wseq[i % len(seq)][i // len(seq) % args.weights],  # noqa: E731
                                     xs[seq[i % len(seq)][2]], out=ys[i % len(seq)])
        elif args.moe:
            ids = torch.as_tensor(np.stack([rng.choice(e, top, replace=False) for _ in range(t)]).astype(np.int32),
                                  device="cuda")
            y = torch.empty(t, top, m, device="cuda")
            fn = lambda i: r.mul_mat_id(ws[i % len(ws)], x, ids, out=y)  # noqa: E731
        else:
            y = torch.empty(t, m, device="cuda")
            fn = lambda i: r.mul_mat(ws[i % len(ws)], x, out=y)  # noqa: E731
        for i in range(3):
            fn(i)
        g = _capture(torch, fn, args.calls)
        for label in ("graph", "eager"):
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                if label == "graph":  # behind bench_op's lead: the host's submission of the graph not timed
                    lead(torch)
                a.record()
                if label == "graph":
                    g.replay()
                else:
                    for i in range(args.calls):
                        fn(i)
                b.record()
                torch.cuda.synchronize()
            what = f"mul_mat_id {e}x{top} " if args.moe else ""
            op = f"the sequence {args.ops}" if seq else f"{args.fmt} {m}x{k}"
            report(f"{what}{op} T={t} x {args.x_dtype} {label}", timeline(torch, prof), args.calls,
                   a.elapsed_time(b) * 1e3, args.show)
        del g


if __name__ == "__main__":
    main()
