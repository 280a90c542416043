"""Probe: a timeline of the Q4_K decode GEMV in a graph-replayed decode loop. gemv_q4_k_mma_t1 is rebuilt from the
DSL with kernels/gemv_t1.py TRACE (lane 0 of each CTA's first warp overwrites its tile's first 6 y words with
(%smid, %globaltimer_lo at entry, after griddepcontrol.wait, when its first step's copies landed, after its K loop,
after its y stores)) and swapped in; `--weights`
mul_mat calls over distinct weights (from HBM) are captured into one CUDA graph, each with its own y, as bench_op's
decode loop. Prints, per op, when its CTAs entered, passed the wait (the prep kernel's records ready) and ended,
relative to the loop's first entry, and the loop's mean gaps: the previous GEMV's last end to this one's first wait
release (the prep kernel and two grid dependencies), this GEMV's first release to its last end (its streaming).
A schedule probe, not a timing of record (the trace adds a store a CTA; the graph µs of both builds are printed).

usage: python3 bench/probe_decode_trace.py --shape 4096x14336 [--weights 24] [--variant 'name: mod.ATTR=literal']
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np  # noqa: E402

KERNEL = "gemv_q4_k_mma_t1"


def op_records(words: np.ndarray, rows_mod: int = 16) -> np.ndarray:
    """(CTA, 6) u32 records of one op's y (rows: the trace's, at multiples of 16 with an SM id < 1024 and an end
    within 1 ms of the entry) → int64 (smid, entry, wait, first step, loop end, end) in ns."""
    w = words[: len(words) // rows_mod * rows_mod].reshape(-1, rows_mod)[:, :6].astype(np.int64)
    ok = (w[:, 0] < 1024) & (((w[:, 5] - w[:, 1]) % 2**32) < 10**6)
    return w[ok]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096x14336", help="M x K")
    ap.add_argument("--weights", type=int, default=24)
    ap.add_argument("--variant", default=None, help="'name: mod.ATTR=literal; ...' set beside the trace")
    ap.add_argument("--fused", action="store_true", help="trace gemv_q4_k_mma_t1_fused (PTXGEN_Q4K_FUSED=on: the "
                    "records built inside the GEMV; its 'wait released' is after them)")
    ap.add_argument("--dump", default=None, help="write the records (op, smid, entry, wait, end ns) as .npy")
    args = ap.parse_args()
    global KERNEL
    import torch

    if args.fused:
        from ptxgen import knobs
        knobs.set(PTXGEN_Q4K_FUSED="on")
        KERNEL += "_fused"

    import ptxgen.runtime as r
    from bench_op import _capture, graphed
    from probe_build_ab import parse_variant, restore, swap
    from ptxgen.kernels import gemv_t1
    from ptxgen.testing.strategies import random_raw

    extra = parse_variant(args.variant)[1] if args.variant else []
    m, k = map(int, args.shape.split("x"))
    n = args.weights
    rng = np.random.default_rng(0)
    raw = random_raw("q4_K", m, k, rng)
    ws = [r.QuantTensor.from_raw("q4_K", raw, (m, k)).to_device() for _ in range(n)]
    x = torch.randn(1, k, device="cuda")
    ys = [torch.empty(1, m, device="cuda") for _ in range(n)]
    call = lambda i: r.mul_mat(ws[i % n], x, out=ys[i % n])  # noqa: E731
    plan = r.mul_mat_plan(ws[0], 1, graph=True).kernels
    print(f"Q4_K {m}x{k}, T = 1, {n} weights; graph kernels: {' + '.join(plan)}")
    if KERNEL not in plan:
        raise SystemExit(f"{KERNEL} is not in the graph plan")
    base = graphed(torch, call, calls=4 * n)
    if extra:
        old = swap([KERNEL], extra)
        for w in ws:
            w._plans.clear()
        base_v = graphed(torch, call, calls=4 * n)
        restore(old)
    old = swap([KERNEL], [(gemv_t1, "TRACE", True)] + extra)
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
    ref = min(int(rr[:, 1].min()) for rr in recs if len(rr))
    unwrap = lambda v: ((v - ref + 2**31) % 2**32) - 2**31  # noqa: E731
    rows = []
    print("| op | CTAs | SMs | entry first / median / last µs | wait released first / median / last | end first / "
          "median / last |")
    print("|---|---|---|---|---|---|")
    for i, rr in enumerate(recs):
        e, wt, en, fs, le = (unwrap(rr[:, c]) / 1e3 for c in (1, 2, 5, 3, 4))
        rows.append((e, wt, en, fs, le))
        q = lambda v: " / ".join(f"{a:.2f}" for a in np.percentile(v, [0, 50, 100]))  # noqa: E731
        print(f"| {i} | {len(rr)} | {len(np.unique(rr[:, 0]))} | {q(e)} | {q(wt)} | {q(en)} |")
    if args.dump:
        np.save(args.dump, np.concatenate([np.column_stack([np.full(len(rr), i), rr]) for i, rr in enumerate(recs)]))
    per = [(rows[i + 1][1].min() - rows[i][2].max(), rows[i][2].max() - rows[i][1].min(),
            rows[i + 1][0].min() - rows[i][0].min(), rows[i][1].min() - rows[i][0].min(),
            np.median(rows[i][2]) - rows[i][1].min(), rows[i][2].max() - np.median(rows[i][2]),
            np.median(rows[i][3] - rows[i][1]), np.median(rows[i][4] - rows[i][3]), np.median(rows[i][2] - rows[i][4]))
           for i in range(1, n - 1)]
    names = ("last end -> next op's first wait release (prep + dependencies)",
             "first wait release -> last end (streaming after the records)",
             "first entry -> next op's first entry (the period)",
             "first entry -> first wait release (weights only, before the records)",
             "first wait release -> median end", "median end -> last end (the tail)",
             "a CTA's wait release -> its first step's copies landed (median)",
             "a CTA's first step -> its K loop's end (median)", "a CTA's K loop's end -> its stores done (median)")
    for j, nm in enumerate(names):
        v = np.array([p[j] for p in per])
        print(f"- {nm}: mean {v.mean():.2f} µs (min {v.min():.2f}, max {v.max():.2f})")


if __name__ == "__main__":
    main()
