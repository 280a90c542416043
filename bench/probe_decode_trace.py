"""Probe: a timeline of a one-token decode GEMV in a graph-replayed decode loop. gemv_q4_k_mma_t1 (or, --format,
another codec's gemv_<fmt>_mma_t1: Q5_K's, or Q6_K's / Q8_0's on prep_sub16_t1, their rule turned on; --i8: the int8
build shipped at T = 1, gemv_<fmt>_i8_t1 behind prep_q4k_i8_t1 / prep_q6k_i8_t1) is rebuilt from the
DSL with kernels/gemv_t1.py TRACE (lane 0 of each CTA's first warp overwrites its tile's first 6 y words with
(%smid, %globaltimer_lo at entry, after its prologue (griddepcontrol.wait and the copies issued after it), when its
first step's copies landed, after the first warp's K loop, after its y stores), then the prep's stamps) and swapped
in, with prep_q4k_t1 rebuilt with kernels/gemv.py PREP_TRACE (its CTAs' entry, wait release and stores' end in their
records' padding, which the GEMV copies); `--weights`
mul_mat calls over distinct weights (from HBM) are captured into one CUDA graph, each with its own y, as bench_op's
decode loop. Prints, per op, when its CTAs entered, passed the wait (the prep kernel's records ready) and ended,
relative to the loop's first entry, and the loop's mean gaps: the previous GEMV's last end to this one's first wait
release (the prep kernel and two grid dependencies), this GEMV's first release to its last end (its streaming).
A schedule probe, not a timing of record (the trace adds a store a CTA; the graph µs of both builds are printed).

usage: python3 bench/probe_decode_trace.py --shape 4096x14336 [--format q8_0] [--i8] [--weights 24]
       [--variant 'name: mod.ATTR=literal']
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np  # noqa: E402

STAMPS = ("entry", "wait", "first", "loop", "end", "prep_entry", "prep_wait", "prep_end")  # words 1-8 (0: %smid)


def op_records(words: np.ndarray, rows_mod: int = 16) -> np.ndarray:
    """(CTA, 9) u32 records of one op's y (rows: the trace's, at multiples of 16 with an SM id < 1024, an end within
    1 ms of the entry and after it) → int64 (smid, *STAMPS), raw %globaltimer_lo (the prep's 0 where untraced)."""
    w = words[: len(words) // rows_mod * rows_mod].reshape(-1, rows_mod)[:, :9].astype(np.int64)
    span = (w[:, 5] - w[:, 1]) % 2**32
    ok = (w[:, 0] < 1024) & (span > 0) & (span < 10**6)
    return w[ok]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096x14336", help="M x K")
    ap.add_argument("--weights", type=int, default=24)
    ap.add_argument("--format", default="q4_K", choices=("q4_K", "q5_K", "q6_K", "q8_0"),
                    help="the codec whose one-token build is traced")
    ap.add_argument("--variant", default=None, help="'name: mod.ATTR=literal; ...' set beside the trace")
    ap.add_argument("--i8", action="store_true", help="trace the int8 pair as shipped (gemv_<fmt>_i8_t1 behind "
                    "prep_q4k_i8_t1 / prep_q6k_i8_t1) rather than the fp16 few-token builds")
    ap.add_argument("--fused", action="store_true", help="trace gemv_q4_k_mma_t1_fused (PTXGEN_Q4K_FUSED=on: the "
                    "records built inside the GEMV; its 'wait released' is after them)")
    ap.add_argument("--dump", default=None, help="write the records as .npy: (op, smid, entry, wait, first step, "
                    "loop end, end), the times raw %%globaltimer_lo u32")
    args = ap.parse_args()
    if args.weights < 3:
        raise SystemExit("--weights: at least 3 (the gaps are taken between an op's neighbours)")
    import torch

    from ptxgen import tuning
    from ptxgen.specs import GemvKernel

    fmt = args.format
    if args.i8 and args.fused:
        raise SystemExit("--i8 and --fused: the fused int8 builds are the eager calls' (not in a graph's plan)")
    kernel, prep = GemvKernel("few", fmt, 1, i8=args.i8).name, GemvKernel("prep_few", fmt, 1, i8=args.i8).name
    tuning.set(codec_few_max_tokens={"q5_K": 32, "q6_K": 8, "q8_0": 8})
    if not args.i8:  # the fp16 few-token builds (the int8 ones, shipped at 1-2 / 1-4 / 1-8 / 1-8 tokens, off)
        tuning.set(few_i8_max_tokens={"q4_K": 0, "q5_K": 0, "q6_K": 0, "q8_0": 0})
    if args.fused:
        from ptxgen import knobs
        knobs.set(PTXGEN_Q4K_FUSED="on")
        kernel += "_fused"

    import ptxgen.runtime as r
    from bench_op import _capture, graphed
    from probe_build_ab import parse_variant, restore, swap
    from ptxgen.kernels import gemv, gemv_t1
    from ptxgen.testing.strategies import random_raw

    extra = parse_variant(args.variant)[1] if args.variant else []
    m, k = map(int, args.shape.split("x"))
    n = args.weights
    rng = np.random.default_rng(0)
    raw = random_raw(fmt, m, k, rng)
    ws = [r.QuantTensor.from_raw(fmt, raw, (m, k)).to_device() for _ in range(n)]
    x = torch.randn(1, k, device="cuda")
    ys = [torch.empty(1, m, device="cuda") for _ in range(n)]
    call = lambda i: r.mul_mat(ws[i % n], x, out=ys[i % n])  # noqa: E731
    plan = r.mul_mat_plan(ws[0], 1, graph=True).kernels
    print(f"{fmt} {m}x{k}, T = 1, {n} weights; graph kernels: {' + '.join(plan)}")
    if kernel not in plan:
        raise SystemExit(f"{kernel} is not in the graph plan")
    base = graphed(torch, call, calls=4 * n)
    if extra:
        old = swap([kernel], extra)
        for w in ws:
            w._plans.clear()
        base_v = graphed(torch, call, calls=4 * n)
        restore(old)
    traced_names = [kernel] if args.fused else [kernel, prep]  # the fused build has no prep kernel
    old = swap(traced_names, [(gemv_t1, "TRACE", True), (gemv, "PREP_TRACE", True)] + extra)
    for w in ws:
        w._plans.clear()
    traced = graphed(torch, call, calls=4 * n)
    print(f"graph µs per op: shipped {base:.2f}" + (f", variant {base_v:.2f}" if extra else "") +
          f", trace build {traced:.2f}")
    g = _capture(torch, call, n)  # (replayed once)
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    recs = [op_records(y.view(torch.int32).cpu().numpy().view(np.uint32).ravel()) for y in ys]
    restore(old)
    if not all(len(rr) for rr in recs):
        raise SystemExit("an op wrote no trace records: the plan splits K over the grid (the trace needs one split)")
    ref = min(int(rr[:, 1].min()) for rr in recs)
    unwrap = lambda v: ((v - ref + 2**31) % 2**32) - 2**31  # noqa: E731
    ops = []  # per op: the CTAs' stamps in µs by name, in the record's order
    print("| op | CTAs | SMs | entry first / median / last µs | wait released first / median / last | end first / "
          "median / last |")
    print("|---|---|---|---|---|---|")
    q = lambda v: " / ".join(f"{a:.2f}" for a in np.percentile(v, [0, 50, 100]))  # noqa: E731
    for i, rr in enumerate(recs):
        o = {name: unwrap(rr[:, c]) / 1e3 for c, name in enumerate(STAMPS, start=1)}
        o["prep"] = bool(rr[:, 6:].any())
        ops.append(o)
        print(f"| {i} | {len(rr)} | {len(np.unique(rr[:, 0]))} | {q(o['entry'])} | {q(o['wait'])} | {q(o['end'])} |")
    if args.dump:
        np.save(args.dump, np.concatenate([np.column_stack([np.full(len(rr), i), rr]) for i, rr in enumerate(recs)]))
    gaps = {  # name: f(this op, the next op) in µs
        "last end -> next op's first wait release (prep + dependencies)": lambda o, p: p["wait"].min() - o["end"].max(),
        "first wait release -> last end (streaming after the records)": lambda o, p: o["end"].max() - o["wait"].min(),
        "first entry -> next op's first entry (the period)": lambda o, p: p["entry"].min() - o["entry"].min(),
        "first entry -> first wait release (weights only, before the records)":
            lambda o, p: o["wait"].min() - o["entry"].min(),
        "first wait release -> median end": lambda o, p: np.median(o["end"]) - o["wait"].min(),
        "median end -> last end (the tail)": lambda o, p: o["end"].max() - np.median(o["end"]),
        "a CTA's wait release -> its first step's copies landed (median)":
            lambda o, p: np.median(o["first"] - o["wait"]),
        "a CTA's first step -> its first warp's K loop's end (median)": lambda o, p: np.median(o["loop"] - o["first"]),
        "a CTA's first warp's K loop's end -> its stores done (the K parts' sum; median)":
            lambda o, p: np.median(o["end"] - o["loop"])}
    if all(o["prep"] for o in ops):  # the prep's CTA 0 (its super-block's record): the chain in three
        gaps.update({
            "the next op's prep CTA 0: entry -> this op's last end (resident before it)":
                lambda o, p: o["end"].max() - np.median(p["prep_entry"]),
            "this op's last end -> the next prep's wait release":
                lambda o, p: np.median(p["prep_wait"]) - o["end"].max(),
            "the next prep's wait release -> its stores issued":
                lambda o, p: np.median(p["prep_end"] - p["prep_wait"]),
            "the next prep's stores -> the next GEMV's first release":
                lambda o, p: p["wait"].min() - np.median(p["prep_end"])})
    for name, f in gaps.items():
        v = np.array([f(ops[i], ops[i + 1]) for i in range(1, n - 1)])  # (op 0 starts the loop: left out)
        print(f"- {name}: mean {v.mean():.2f} µs (min {v.min():.2f}, max {v.max():.2f})")


if __name__ == "__main__":
    main()
