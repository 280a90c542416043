"""Probe: where the grouped MoE GEMM's work items run on the GPU. The route's grouped GEMM is rebuilt from the DSL
with kernels/mmq.py GROUPED_TRACE (each item's consumer thread 0 writes (CTA, SM, %globaltimer_lo when the item
reached the consumers, ... after its K loop) at y + 16·item instead of the item's y rows) and swapped in for one
call of mul_mat_id (after warm-up calls, weights in L2 as bench_moe's small cells are not: a schedule probe, not a
timing of record). Prints per T the kernel's span, the items' durations, how the items and the finishing times
spread over the SMs and the CTAs, and the tail: what ran after most SMs were done.

usage: python3 bench/probe_moe_trace.py --moe 128:8 --shape 768x2048 --tokens 32,512 [--format q4_K] [--dump F]
       [--variant 'name: mod.ATTR=literal; ...']   (build attributes set beside the trace, as probe_build_ab's)
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np  # noqa: E402


def records(words: np.ndarray) -> np.ndarray:
    """y's first words as (item, 4) u32 records → int64 rows (item, cta, sm, start ns, end ns) of the items that
    wrote one (end ≠ 0), the times relative to the first start (globaltimer_lo wraps every 4.3 s: unwrapped)."""
    rec = words[: len(words) // 4 * 4].reshape(-1, 4).astype(np.int64)
    item = np.arange(len(rec))
    ok = rec[:, 3] != 0
    rec, item = rec[ok], item[ok]
    if not len(rec):
        return np.zeros((0, 5), np.int64)
    ref = rec[:, 2].min()
    rel = lambda v: ((v - ref + 2**31) % 2**32) - 2**31  # noqa: E731
    return np.stack([item, rec[:, 0], rec[:, 1], rel(rec[:, 2]), rel(rec[:, 3])], axis=1)


def summarize(r: np.ndarray, sms: int) -> list[str]:
    """Lines describing one trace (records' rows as `records` returns them)."""
    if not len(r):
        return ["no items traced"]
    us = lambda v: f"{v / 1e3:.1f}"  # noqa: E731
    start, end = r[:, 3], r[:, 4]
    span = end.max() - start.min()
    dur = end - start
    out = [f"{len(r)} items on {len(np.unique(r[:, 1]))} CTAs, {len(np.unique(r[:, 2]))} SMs; span {us(span)} µs "
           f"(first start to last end)",
           "item µs (consumers' start to the K loop's end): min / median / p90 / max " +
           " / ".join(us(v) for v in np.percentile(dur, [0, 50, 90, 100]))]
    per_sm = np.bincount(r[:, 2], minlength=sms)
    sm_end = np.full(sms, -1, np.int64)
    np.maximum.at(sm_end, r[:, 2], end)
    used = sm_end >= 0
    out.append("items an SM: " + ", ".join(f"{c} on {n}" for c, n in zip(*np.unique(per_sm[used], return_counts=True))))
    q = np.percentile(sm_end[used], [0, 50, 90, 100])
    out.append("SMs' last end µs: min / median / p90 / max " + " / ".join(us(v) for v in q))
    per_cta = np.bincount(r[:, 1])
    cta_end = np.zeros(len(per_cta), np.int64)
    np.maximum.at(cta_end, r[:, 1], end)
    out.append("items a CTA: " + ", ".join(f"{c} on {n}" for c, n in zip(*np.unique(per_cta[per_cta > 0],
                                                                                   return_counts=True))))
    late = end > q[1]  # what ran after half of the SMs were done
    out.append(f"after the median SM's end ({us(q[1])} µs): {int(late.sum())} items still running, "
               f"{us(span - q[1])} µs of the span")
    busy = dur.sum() / (used.sum() * span)  # item-time an SM (2 CTAs: up to 2) over the span
    out.append(f"item-time a used SM over the span: {busy:.2f} (CTAs an SM overlap: up to their count)")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moe", default="128:8", metavar="E:TOP")
    ap.add_argument("--shape", default="768x2048", help="an expert's M x K")
    ap.add_argument("--tokens", default="32,512")
    ap.add_argument("--format", default="q4_K")
    ap.add_argument("--dump", default=None, help="write every T's records (item, cta, sm, start, end) to this .npz")
    ap.add_argument("--variant", default=None, help="'name: mod.ATTR=literal; ...' set beside the trace")
    args = ap.parse_args()
    import torch

    import ptxgen.runtime as r
    from bench_moe import routing
    from probe_build_ab import parse_variant, restore, swap
    from ptxgen.kernels import mmq
    from ptxgen.runtime import driver
    from ptxgen.testing.strategies import random_raw

    e, top = map(int, args.moe.split(":"))
    m, k = map(int, args.shape.split("x"))
    fmt = args.format
    w = r.QuantTensor.from_raw(fmt, random_raw(fmt, e * m, k, np.random.default_rng(0)), (e, m, k)).to_device()
    sms = driver.current().sm_count
    dumps = {}
    extra = parse_variant(args.variant)[1] if args.variant else []
    if any(m_ == "rule" for m_, _, _ in extra):
        raise SystemExit("--variant: build attributes only (no rule.NAME)")
    for t in map(int, args.tokens.split(",")):
        ids = torch.as_tensor(routing(e, top, t), device="cuda")
        x = torch.randn(t, k, device="cuda")
        y = torch.empty(t, top, m, device="cuda")
        route = r.mul_mat_id_plan(w, t, top).kernels
        gemm = [n for n in route if n.startswith("mmq_")]
        print(f"\n## {fmt} {e} experts top-{top} {m}x{k}, T = {t}: {' + '.join(route)}")
        if not gemm:
            print("no grouped GEMM on this route")
            continue
        old = swap(gemm, [(mmq, "GROUPED_TRACE", True)] + extra)
        try:
            w._plans.clear()
            for _ in range(3):
                r.mul_mat_id(w, x, ids, out=y)
            y.zero_()
            r.mul_mat_id(w, x, ids, out=y)
            torch.cuda.synchronize()
        finally:
            restore(old)
            w._plans.clear()
        rec = records(y.flatten().view(torch.int32).cpu().numpy().view(np.uint32))
        dumps[f"t{t}"] = rec
        print("\n".join(f"- {line}" for line in summarize(rec, sms)))
    if args.dump:
        np.savez(args.dump, **dumps)


if __name__ == "__main__":
    main()
