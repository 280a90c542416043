"""The op as users call it (needs a GPU and torch): `mul_mat` with torch tensors in and `out=` given, timed three
ways per shape and T, beside cuBLAS fp16 (`F.linear` on fp16 weights, fp16 x) timed the same three ways and
llama.cpp's figure (shared/PERF.md, op-level on the same H200 model):

- kernel (isolated): CUDA events around one call behind a 0.5 ms sleep, so the host has long enqueued it (device
  time, as the earlier benchmarks of record measured it; the GPU idles between calls, so it runs cooler and may
  clock higher than under back-to-back work);
- eager: CUDA events around 100 back-to-back Python calls (no synchronization between them), per call;
- graph: the same 100 calls captured once with torch.cuda.graph, events around a replay, per call; the replay
  starts behind a 1 ms torch.cuda._sleep (LEAD_CYCLES), so the start event does not time the host submitting the
  graph (cuGraphLaunch of a graph of 100-300 kernels, host time the GPU waits out when idle: once a replay, not
  once an op; a warning is printed where it approaches the lead). Where the host waits for each replay's result
  (a decode loop sampling on the host) that submission is on the critical path: the decode-loop table prints the
  replay without the lead beside it (graph_nolead; before 2026-12-03 every replay was timed that way);
- busy (kernel-only under the op's own load): in one more eager loop and one more replay, run under CUPTI
  (torch.profiler), the time the GPU spent in any kernel of the loop — the union of the kernels' intervals, so
  kernels that overlap (programmatic dependent launch) count once — per call. A loop of 0.8 ms GEMMs holds the GPU
  at its 700 W limit and its clocks drop, an isolated kernel behind a sleep runs cooler: cuBLAS's own T = 4096
  GEMM reads ~15% slower in a loop than isolated, so "kernel isolated" cannot be the yardstick there. Printed:
  eager ÷ busy and graph ÷ busy (the unprofiled loops over the profiled ones' busy: two loops, so the GPU's power
  state may differ by a few %), and graph ÷ kernels within one profiled replay (its events over its own busy:
  the time the op adds to its kernels, nothing else differing; behind lead(), CUPTI adds nothing measurable).

Weights rotate over copies holding ≥ 4× the 60 MB L2 in all three (they come from HBM). Then a decode loop over
24 distinct weights of each --loop-formats format (4096×14336; TQ4_1S 18944×3584) at T = 1, 2, 4, 8, exact mode
(eager and graph-replayed) beside the same loop of F.linear on 24 fp16 weights and of a kernel that only reads the
same bytes (probe_decode_floor's, plain and with PDL: the floor) — decode_loop.py's loop and table, which
bench_gemv.py runs over every shape, mode and format — and the host time per call at T=1
(4096×4096 Q4_K, out= given; calls in bursts of 50 between synchronizations, so the launch queue never fills)
beside F.linear's, in the same run (rounds alternating between the two, medians). Prints tables, writes JSON (--out) and a PNG beside it.
"""
import argparse
import json
import math
import time

import numpy as np

from bench_gemv import HBM, HBM_NOTE, need_torch

L2 = 60e6
SHAPES = {"q4_K": [(4096, 4096), (14336, 4096), (4096, 14336)], "tq4_1s": [(18944, 3584)],
          "q5_K": [(4096, 14336)], "q6_K": [(4096, 14336)], "q8_0": [(4096, 14336)]}
TOKENS = {"q4_K": (1, 8, 16, 64, 512, 4096), "tq4_1s": (1, 8, 512)}
# shared/PERF.md: llama.cpp test-backend-ops MUL_MAT q4_K, µs per op (M=4096 rows of K=14336 is its "M=4096, K=14336")
LLAMA = {((4096, 14336), 1): 16.3, ((4096, 14336), 8): 67.1, ((4096, 14336), 16): 37.4, ((4096, 14336), 64): 70.5,
         ((4096, 14336), 512): 359.9, ((4096, 14336), 4096): 2714.2, ((14336, 4096), 16): 35.5,
         ((14336, 4096), 512): 384.2, ((14336, 4096), 4096): 2640.0, ((4096, 4096), 16): 18.5,
         ((4096, 4096), 512): 105.3, ((4096, 4096), 4096): 805.0}
LLAMA_OTHER = {  # the same table's other formats, M=4096, K=14336: {fmt: {T: µs}}
    "q5_K": {1: 18.7, 8: 70.2, 16: 42.5, 64: 76.8, 512: 373.3, 4096: 2824.6},
    "q6_K": {1: 28.4, 8: 62.4, 16: 56.6, 64: 91.8, 512: 436.2, 4096: 3350.2},
    "q8_0": {1: 23.0, 8: 46.1, 16: 49.2, 64: 75.0, 512: 323.0, 4096: 2465.4}}
CALLS = 100


def kernel_only(torch, fn, reps):
    """Events around one call behind a 0.5 ms sleep, median of `reps` (bench_gemv.timed)."""
    from bench_gemv import timed

    return timed(fn, reps, torch)


LEAD_CYCLES = 2_000_000  # ~1 ms of torch.cuda._sleep ahead of a timed loop (see the module's docstring)
LEAD_WARN_S = 0.7e-3  # a replay's host submission past this: warned (the lead may not have covered it)


def lead(torch) -> None:
    """Keep the GPU busy for ~1 ms, so a loop enqueued behind it runs back to back from its first call."""
    torch.cuda._sleep(LEAD_CYCLES)


def eager(torch, fn, calls=CALLS, rounds=3):
    """µs per call over `calls` back-to-back calls (median of `rounds`), the GPU idle at the start of each (no
    lead(): the host's time per call must show where it exceeds the kernels')."""
    best = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for i in range(calls):
            fn(i)
        e.record()
        torch.cuda.synchronize()
        best.append(s.elapsed_time(e) * 1e3 / calls)
    return float(np.median(best))


def graphed(torch, fn, calls=CALLS, rounds=3, lead_first=True):
    """µs per call of `calls` calls captured once into a CUDA graph (median of `rounds` replays, each behind
    lead())."""
    g = _capture(torch, fn, calls)
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if lead_first:
            lead(torch)
        a.record()
        t0 = time.perf_counter()
        g.replay()
        submit = time.perf_counter() - t0
        if lead_first and submit > LEAD_WARN_S:  # the GPU may have waited for the host after all
            print(f"warning: submitting the replay took {submit * 1e6:.0f} µs of host time, near the "
                  f"{LEAD_CYCLES / 2e3:.0f} µs lead: the graph time may include some of it", flush=True)
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / calls)
    del g
    return float(np.median(out))


def kernel_us(torch, call, reps: int = 20) -> dict:
    """{kernel name: CUDA µs per call} of `reps` calls of call() under torch.profiler (3 warm-up calls first): each
    kernel's device time, whatever the host spends (the probes' per-kernel view; the op's time is eager / graphed)."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    tot = defaultdict(float)
    for ev in prof.key_averages():
        us = getattr(ev, "self_device_time_total", None)
        us = ev.self_cuda_time_total if us is None else us
        if us > 0 and not ev.key.startswith(("cuda", "aten")):
            tot[ev.key] += us / reps
    return dict(tot)


def _busy(torch, prof) -> float:
    """µs the GPU spent in kernels during `prof`: the union of the CUDA kernels' [start, end) intervals."""
    return span_union((ev.time_range.start, ev.time_range.end) for ev in prof.events()
                      if ev.device_type == torch.autograd.DeviceType.CUDA and "spin_kernel" not in ev.name)  # not lead()


def span_union(spans) -> float:
    """The length of the union of [start, end) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    spans = sorted(spans)
    for a, b in spans:
        if cur_e is None or a > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    return total + (cur_e - cur_s if cur_e is not None else 0.0)


def eager_busy(torch, fn, calls=CALLS):
    """(events µs per call, GPU-busy µs per call) of one loop of `calls` back-to-back calls under CUPTI."""
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        s.record()
        for i in range(calls):
            fn(i)
        e.record()
        torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / calls, _busy(torch, prof) / calls


def _capture(torch, fn, calls):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(min(calls, 3)):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    g.replay()
    return g


def graph_busy(torch, fn, calls=CALLS):
    """(events µs per call, GPU-busy µs per call) of one replay of `calls` captured calls under CUPTI."""
    g = _capture(torch, fn, calls)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        lead(torch)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
    del g
    return a.elapsed_time(b) * 1e3 / calls, _busy(torch, prof) / calls


def host_us(torch, fn, calls=1000, burst=50):
    """Host µs per call: `calls` calls in bursts of `burst`, the GPU drained between bursts (not counted), after a
    warm-up burst (the first calls of a library set it up)."""
    for i in range(burst):
        fn(i)
    total = 0.0
    for b in range(calls // burst):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(burst):
            fn(b * burst + i)
        total += time.perf_counter() - t0
    torch.cuda.synchronize()
    return total / calls * 1e6


def three_ways(torch, fn, reps):
    out = {"kernel": kernel_only(torch, fn, reps), "eager": eager(torch, fn), "graph": graphed(torch, fn),
           "graph_nolead": graphed(torch, fn, lead_first=False)}
    out["eager_profiled"], out["eager_busy"] = eager_busy(torch, fn)
    out["graph_profiled"], out["graph_busy"] = graph_busy(torch, fn)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=30, help="kernel-only samples per cell")
    ap.add_argument("--formats", default="q4_K,tq4_1s")
    ap.add_argument("--tokens", default=None, help="comma-separated T (default: each format's list)")
    ap.add_argument("--shape", default=None, help="MxK instead of each format's shapes (e.g. 18944x3584)")
    ap.add_argument("--no-decode-loop", action="store_true")
    ap.add_argument("--loop-formats", default="q4_K", help="formats of the decode loop (e.g. q4_K,q5_K,q6_K,q8_0,tq4_1s)")
    ap.add_argument("--host-only", action="store_true", help="only the host time per call")
    ap.add_argument("--x-dtype", default="float32", choices=("float32", "float16"),
                    help="the activations mul_mat is given in the op table (cuBLAS always gets float16)")
    ap.add_argument("--rule", action="append", default=[], metavar="NAME=JSON",
                    help="a dispatch rule of ptxgen/tuning overridden for this run, e.g. mmq_min_tokens=9 or "
                         "'codec_ra_mmq_max_tokens={\"q5_K\": 2048, \"q6_K\": 4096, \"q8_0\": 1073741824}'")
    ap.add_argument("--x-buffers", type=int, default=1, metavar="N",
                    help="the calls rotate over N activation buffers (distinct addresses: an fp16 x read by a tensor "
                         "map over it costs a host encode per new address, plans.Bound memoises 16)")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                    help="force a kernel choice, e.g. PTXGEN_MMQ_CX=0 (ptxgen/knobs.py LOWERING; repeatable)")
    ap.add_argument("--rotation", default="auto", choices=("auto", "separate", "fused"),
                    help="mul_mat's rotation= for TQ4_1S (fused: the rotation inside the GEMV, T ≤ 4)")
    args = ap.parse_args()
    print(HBM_NOTE)
    loop_formats = args.loop_formats.split(",")
    from decode_loop import SHAPES as LOOP_SHAPES

    if not set(loop_formats) <= set(LOOP_SHAPES):
        ap.error(f"--loop-formats: unknown {sorted(set(loop_formats) - set(LOOP_SHAPES))}")
    from ptxgen import knobs

    knobs.set(**knobs.parse(args.knob))
    from ptxgen import tuning

    tuning.set(**{n: json.loads(v) for n, v in (a.split("=", 1) for a in args.rule)})
    torch = need_torch()
    import torch.nn.functional as F

    import ptxgen.runtime as r
    from ptxgen import formats
    from ptxgen.runtime import ops
    from ptxgen.testing.strategies import random_raw

    rng = np.random.default_rng(0)
    res = {"device": torch.cuda.get_device_name(), "op": [], "decode_loop": [], "host": {}}
    print("| fmt | M×K | T | ptxgen kernel isolated µs | eager / graph µs | eager ÷ busy (busy µs) | graph ÷ busy "
          "(busy µs) | graph ÷ kernels, one replay | cuBLAS fp16 isolated / eager / graph µs | llama.cpp µs "
          "| cuBLAS graph / ptxgen graph | kernels |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for fmt in ([] if args.host_only else args.formats.split(",")):
        for m, k in ([tuple(int(v) for v in args.shape.split("x"))] if args.shape else SHAPES[fmt]):
            raw = random_raw(fmt, m, k, rng)
            nbytes = m * formats.get(fmt).row_bytes(k)
            ws = [r.QuantTensor.from_raw(fmt, raw, (m, k)).to_device()
                  for _ in range(max(2, math.ceil(4 * L2 / nbytes)))]
            w16 = [torch.randn(m, k, device="cuda", dtype=torch.float16) * 0.02
                   for _ in range(max(2, math.ceil(4 * L2 / (2 * m * k))))]
            tokens = [int(v) for v in args.tokens.split(",")] if args.tokens else TOKENS.get(fmt, (1, 16, 512, 4096))
            for t in tokens:
                xs = [torch.randn(t, k, device="cuda", dtype=getattr(torch, args.x_dtype))
                      for _ in range(max(1, args.x_buffers))]
                x = xs[0]
                y = torch.empty(t, m, device="cuda")
                rot = dict(rotation=args.rotation) if fmt == "tq4_1s" else {}
                r.mul_mat(ws[0], x, out=y, **rot)
                if fmt != "tq4_1s":  # a sanity check of what is timed (the tests check the bounds)
                    wd = torch.as_tensor(r.dequantize(ws[0]), device="cuda").double()
                    err = float(((y.double() - x.double() @ wd.T).norm() / (x.double() @ wd.T).norm()).item())
                    assert err < 2e-3, f"{fmt} {m}x{k} T={t}: relative error {err:.2e}"
                    del wd
                ours = three_ways(torch, lambda i: r.mul_mat(ws[i % len(ws)], xs[i % len(xs)], out=y, **rot),
                                  args.reps)
                xhs = [v.half() for v in xs]
                peer = three_ways(torch, lambda i: F.linear(xhs[i % len(xhs)], w16[i % len(w16)]), args.reps)
                row = {"fmt": fmt, "m": m, "k": k, "T": t, "weight_bytes": nbytes, "ptxgen": ours, "cublas_fp16": peer,
                       "llamacpp": (LLAMA.get(((m, k), t)) if fmt == "q4_K"
                                    else LLAMA_OTHER.get(fmt, {}).get(t) if (m, k) == (4096, 14336) else None),
                       "kernels": ops.mul_mat_plan(ws[0], t, x_dtype=args.x_dtype, **rot).kernels,
                       "x_dtype": args.x_dtype,
                       "x_buffers": len(xs),
                       "graph_kernels": ops.mul_mat_plan(ws[0], t, graph=True, x_dtype=args.x_dtype, **rot).kernels,
                       "floor_us": max(nbytes / HBM, 2 * m * k * t / 989e12) * 1e6}
                res["op"].append(row)
                print(f"| {fmt} | {m}×{k} | {t} | {ours['kernel']:.1f} | "
                      f"{ours['eager']:.1f} / {ours['graph']:.1f} | "
                      f"{ours['eager'] / ours['eager_busy']:.2f} ({ours['eager_busy']:.1f}) | "
                      f"{ours['graph'] / ours['graph_busy']:.2f} ({ours['graph_busy']:.1f}) | "
                      f"{ours['graph_profiled'] / ours['graph_busy']:.3f} | "
                      f"{peer['kernel']:.1f} / {peer['eager']:.1f} / {peer['graph']:.1f} | "
                      f"{row['llamacpp'] or '—'} | {peer['graph'] / ours['graph']:.2f}× | "
                      f"{' + '.join(dict.fromkeys(row['kernels']))}"
                      + (f" (graph: {' + '.join(dict.fromkeys(row['graph_kernels']))})"
                         if row["graph_kernels"] != row["kernels"] else "") + " |", flush=True)
            ws = w16 = None  # the copies freed before the next shape's
            torch.cuda.empty_cache()

    if not (args.no_decode_loop or args.host_only):
        import decode_loop

        res["decode_loop"] = decode_loop.run(torch, [(f, *decode_loop.SHAPES[f][0]) for f in loop_formats],
                                             modes=("exact",), rng=rng)

    m, k = 4096, 4096
    w = r.QuantTensor.from_raw("q4_K", random_raw("q4_K", m, k, rng), (m, k)).to_device()
    x, y = torch.randn(1, k, device="cuda"), torch.empty(1, m, device="cuda")
    w16 = torch.randn(m, k, device="cuda", dtype=torch.float16)
    xh = x.half()
    r.mul_mat(w, x, out=y)
    from ptxgen.runtime import driver

    s = torch.cuda.current_stream().cuda_stream
    bound = ops.mul_mat_plan(w, 1).bound(ops.workspace_for(ops.mul_mat_plan(w, 1), s))
    get_stream = driver.torch_stream_getter()
    parts = {"mul_mat_out": lambda i: r.mul_mat(w, x, out=y), "mul_mat": lambda i: r.mul_mat(w, x),
             "F.linear": lambda i: F.linear(xh, w16),
             "launches_only": lambda i: bound.run(x.data_ptr(), y.data_ptr(), s),
             "torch_stream_query": lambda i: get_stream(0), "capture_query": lambda i: driver.capture_id(s)}
    rounds = {name: [] for name in parts}
    for _ in range(10):  # alternate, so a slow spell of the host hits every column alike
        for name, fn in parts.items():
            rounds[name].append(host_us(torch, fn, calls=200))
    host = {name: float(np.median(v)) for name, v in rounds.items()}
    ratios = [a / b for a, b in zip(rounds["mul_mat_out"], rounds["F.linear"])]
    host["ratio_median"], host["ratio_max"] = float(np.median(ratios)), float(max(ratios))
    res["host"] = host
    nl = len(bound.launches) if hasattr(bound, "launches") else len(ops.mul_mat_plan(w, 1).launches)
    print("\nhost time per call, T=1, 4096×4096 (µs; medians of 10 alternating rounds of 200 calls in bursts of 50), "
          "and its parts:")
    print(f"| mul_mat(out=) | mul_mat | F.linear (fp16) | mul_mat(out=) / F.linear, median (max) of the rounds | its "
          f"{nl} launch(es) alone | torch stream query | capture query |\n|---|---|---|---|---|---|---|")
    print(f"| {host['mul_mat_out']:.1f} | {host['mul_mat']:.1f} | {host['F.linear']:.1f} | "
          f"{host['ratio_median']:.2f} ({host['ratio_max']:.2f}) | {host['launches_only']:.1f} | "
          f"{host['torch_stream_query']:.2f} | {host['capture_query']:.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        plot(res, args.out.replace(".json", ".png"))


def plot(res, path):
    from bench_gemv import pyplot

    plt = pyplot()
    if plt is None:
        print("matplotlib missing: no plot")
        return
    shapes = sorted({(o["fmt"], o["m"], o["k"]) for o in res["op"]})
    if not shapes:
        return
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4), squeeze=False)
    for ax, (fmt, m, k) in zip(axes[0], shapes):
        rows = [o for o in res["op"] if (o["fmt"], o["m"], o["k"]) == (fmt, m, k)]
        ts = [o["T"] for o in rows]
        for who, style in (("ptxgen", "-"), ("cublas_fp16", ":")):
            for how, mark in (("kernel", "o"), ("eager", "s"), ("graph", "^")):
                ax.plot(ts, [o[who][how] for o in rows], style + mark, label=f"{who} {how}")
        ax.plot(ts, [o["floor_us"] for o in rows], "k--", label="floor")
        log_axes(ax, f"{fmt} {m}×{k}")
    save_figure(fig, axes, path)


def log_axes(ax, title: str) -> None:
    """The benchmarks' plot axes: T (log 2) against µs per op (log)."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel("T (tokens)")
    ax.set_ylabel("µs per op")


def save_figure(fig, axes, path) -> None:
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
