"""MoE matmul as users call it (needs a GPU and torch; #35): `mul_mat_id(w, x, ids, out=y)` with torch tensors in
(x fp32 (T, K), ids int32 (T, top) on the GPU, so the op reads no ids back), per expert shape and T, beside a torch
baseline, llama.cpp's MUL_MAT_ID figure (q4_K, same H200 model) and the goals of #35. Two shapes: 128 experts,
top-8, M×K = 768×2048, and 32 experts, top-4, 1792×2048 (--formats: Q4_K, Q5_K, Q6_K, Q8_0, TQ4_1S); T = 1 ... 512.

- routing: per token `top` distinct experts (rng.choice without replacement), seeded per (experts, top, T), one
  routing per cell (the dry run shows the same ones);
- kernel (isolated, diagnostic): CUDA events around one call behind a 0.5 ms sleep (bench_op.kernel_only);
- eager: CUDA events around 100 back-to-back Python calls, per call (bench_op.eager);
- graph: the same 100 calls captured once with torch.cuda.graph, events around a replay, per call (bench_op.graphed);
- torch fp16 baseline: the experts dequantized once by ptxgen (fp16 (E, M, K)), the (token, slot) pairs sorted by
  expert on the host (the routing is known there, which a model would have to read back: this favours torch), x
  gathered in that order, one F.linear per used expert, the results scattered into y (T, top, M); eager and
  graph-replayed (where capture works);
- floor: the bytes of the experts the routing actually uses / 4.27 TB/s (bench_gemv.HBM).

Calls rotate over copies of the weights whose used bytes (the experts the routing reads, not the whole tensor:
at T = 1 top-8 reads 8 of 128 experts, 7 MB in Q4_K) pass 4× the 60 MB L2, cyclically, so every call reads its
experts from HBM; the fp16 baseline rotates the same way. Before timing, each cell checks the ptxgen result against
the baseline's (relative error < 2e-3, fp16 weights). Prints a markdown table, writes JSON (--out) and a PNG beside
it. `--dry-run` (no GPU, no torch): the table header, each shape's bytes, the planned cells (routing, bytes used,
floor, copies, llama.cpp, goal), and formats.mul_mat_id_ref and the baseline's sorted routing against a NumPy loop
on a small case.

    python3 bench/bench_moe.py --out bench/results/bench_moe.json
    python3 bench/bench_moe.py --formats q4_K,q8_0 --tokens 1,512
"""
import argparse
import json
import math

import numpy as np

from bench_gemv import HBM, HBM_NOTE, need_torch

L2 = 60e6
CALLS = 100
SHAPES = [(128, 8, 768, 2048), (32, 4, 1792, 2048)]  # (experts, top, M, K)
TOKENS = (1, 8, 32, 64, 128, 512)
FORMATS = ("q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s")
# llama.cpp test-backend-ops MUL_MAT_ID q4_K on the H200, µs per op: {(experts, top): {T: µs}}
LLAMA = {(128, 8): {1: 7.53, 8: 25.33, 32: 128.74, 64: 202.61, 128: 306.60, 512: 350.73},
         (32, 4): {1: 9.41, 8: 27.74, 32: 94.63, 64: 128.62, 128: 198.25, 512: 234.33}}
# #35's goals (q4_K, graph-replayed): T = 1 and T = 512 at most these µs, T = 32-128 at least 3× llama.cpp's speed
GOAL_T1 = {(128, 8): 5.8, (32, 4): 7.2}
GOAL_T512 = {(128, 8): 70.0, (32, 4): 47.0}
GOAL_SPEEDUP, GOAL_SPEEDUP_TOKENS = 3.0, (32, 64, 128)


def shape_name(e, top, m, k):
    return f"{e} experts top-{top} {m}×{k}"


def routing(e, top, t):
    """ids (T, top) int32: per token `top` distinct experts of `e`, seeded by the cell."""
    rng = np.random.default_rng((e, top, t))
    return np.stack([rng.choice(e, top, replace=False) for _ in range(t)]).astype(np.int32)


def expert_bytes(fmt, m, k):
    from ptxgen import formats

    return m * formats.get(fmt).row_bytes(k)


def copies_for(used_bytes):
    """Copies to rotate over so that the bytes read between two reads of one copy pass 4× the L2."""
    return max(2, math.ceil(4 * L2 / used_bytes))


def goal(fmt, e, top, t, graph_us=None):
    """(text, met) of #35's goal for the cell (met None where no time is given); (None, None) where none is set."""
    if fmt != "q4_K":
        return None, None
    llama = LLAMA[(e, top)].get(t)
    if t == 1 or t == 512:
        lim = (GOAL_T1 if t == 1 else GOAL_T512)[(e, top)]
        return f"≤ {lim:g} µs", None if graph_us is None else graph_us <= lim
    if t in GOAL_SPEEDUP_TOKENS and llama:
        return (f"≥ {GOAL_SPEEDUP:g}× llama.cpp (≤ {llama / GOAL_SPEEDUP:.1f} µs)",
                None if graph_us is None else llama / graph_us >= GOAL_SPEEDUP)
    return None, None


def sorted_plan(ids):
    """The baseline's routing on the host: the (token, slot) pairs sorted by expert → (order: the pairs' flat
    indices in that order, tokens: their tokens, groups: [(expert, start, stop)] of the sorted pairs)."""
    top = ids.shape[1]
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable")
    experts, starts, counts = np.unique(flat[order], return_index=True, return_counts=True)
    return order, order // top, [(int(x), int(a), int(a + c)) for x, a, c in zip(experts, starts, counts)]


def baseline_numpy(w, x, ids):
    """The baseline's computation in NumPy (the dry run checks its plan): y (T, top, M) from w (E, M, K)."""
    order, tokens, groups = sorted_plan(ids)
    t, top = ids.shape
    xs = x[tokens] if x.ndim == 2 else x.reshape(t * top, -1)[order]
    ys = np.concatenate([xs[a:b] @ w[x_].T for x_, a, b in groups])
    y = np.empty((t * top, w.shape[1]), ys.dtype)
    y[order] = ys
    return y.reshape(t, top, -1)


def header():
    return ("| fmt | experts, top, M×K | T | experts used | ptxgen kernel isolated µs | eager / graph µs | "
            "torch fp16 eager / graph µs | llama.cpp µs | llama.cpp / ptxgen graph | floor µs (floor / graph) | "
            "goal (graph) | rel. err |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def formats_arg(names: str) -> list:
    """--formats as the library spells them, whatever the case (Q5_K, q5_k: q5_K); an unknown one lists the choices."""
    spelled = {f.lower(): f for f in FORMATS}
    unknown = [f for f in names.split(",") if f.strip().lower() not in spelled]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown format(s) {', '.join(map(repr, unknown))} "
                                         f"(choose from {', '.join(FORMATS)})")
    return [spelled[f.strip().lower()] for f in names.split(",")]


def main():
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))  # the first paragraph
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=30, help="kernel-only samples per cell")
    ap.add_argument("--formats", type=formats_arg, default="q4_K",
                    help=f"comma-separated subset of {','.join(FORMATS)} (any case)")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma-separated T")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: shapes, bytes, planned cells, reference check")
    ap.add_argument("--x-dtype", default="float32", choices=("float32", "float16"),
                    help="the activations' dtype mul_mat_id gets (the torch baseline always runs fp16)")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                    help="force a kernel choice, e.g. PTXGEN_MMQ_CX=0 (ptxgen/knobs.py LOWERING; repeatable)")
    ap.add_argument("--rule", action="append", default=[], metavar="NAME=JSON",
                    help="a dispatch rule of ptxgen/tuning overridden for this run (e.g. moe_gemm_min_pairs=16)")
    args = ap.parse_args()
    print(HBM_NOTE)
    import json

    from ptxgen import knobs, tuning

    knobs.set(**knobs.parse(args.knob))
    tuning.set(**{n: json.loads(v) for n, v in (a.split("=", 1) for a in args.rule)})
    fmts = args.formats
    tokens = [int(v) for v in args.tokens.split(",")]
    if args.dry_run:
        dry_run(fmts, tokens)
    else:
        run(args, fmts, tokens)


def dry_run(fmts, tokens):
    from ptxgen.runtime import ops

    print(header())
    print("\nshapes (bytes per expert / whole tensor / fp16 tensor of the baseline):")
    for fmt in fmts:
        for e, top, m, k in SHAPES:
            eb = expert_bytes(fmt, m, k)
            kernels = "; ".join(dict.fromkeys(" + ".join(ops.mul_mat_id_kernels(fmt, t, top, e, k, m, sm=90))
                                          for t in tokens))  # the H200's routes
            print(f"  {fmt} {shape_name(e, top, m, k)}: {eb / 1e6:.3f} MB / {e * eb / 1e6:.1f} MB / "
                  f"{2 * e * m * k / 1e6:.1f} MB; kernels {kernels}")
    print("\nplanned cells:")
    for fmt in fmts:
        for e, top, m, k in SHAPES:
            eb = expert_bytes(fmt, m, k)
            for t in tokens:
                used = len(np.unique(routing(e, top, t)))
                g, _ = goal(fmt, e, top, t)
                llama = f"{LLAMA[(e, top)][t]} µs" if fmt == "q4_K" and t in LLAMA[(e, top)] else "—"
                print(f"  {fmt} {shape_name(e, top, m, k)} T={t}: {used} experts used, {used * eb / 1e6:.1f} MB, "
                      f"floor {used * eb / HBM * 1e6:.1f} µs, copies {copies_for(used * eb)} "
                      f"(fp16 {copies_for(2 * used * m * k)}), llama.cpp {llama}, goal {g or '—'}")
    check_reference(fmts)


def check_reference(fmts, e=8, m=64, k=256, top=2, t=5):
    """formats.mul_mat_id_ref and the baseline's sorted routing against a loop over (token, slot) pairs."""
    import ptxgen.runtime as r
    from ptxgen import formats
    from ptxgen.testing.strategies import random_raw

    rng = np.random.default_rng(1)
    print(f"\nreference check (E={e}, M={m}, K={k}, top-{top}, T={t}):")
    for fmt in fmts:
        raw = random_raw(fmt, e * m, k, rng)
        q = r.QuantTensor.from_raw(fmt, raw, (e, m, k))
        assert q.shape == (e, m, k) and q.nbytes == e * expert_bytes(fmt, m, k)
        w = formats.dequantize(fmt, raw, (e * m, k)).astype(np.float64).reshape(e, m, k)
        ids = routing(e, top, t)
        for per_slot in (False, True):
            x = rng.standard_normal((t, top, k) if per_slot else (t, k)).astype(np.float32)
            loop = np.empty((t, top, m))
            for i in range(t):
                for j in range(top):
                    loop[i, j] = w[ids[i, j]] @ x[i, j if per_slot else slice(None)].astype(np.float64)
            ref = formats.mul_mat_id_ref(fmt, raw, (e, m, k), x, ids)
            base = baseline_numpy(w, x.astype(np.float64), ids)
            e_ref = float(np.abs(ref - loop).max() / np.abs(loop).max())
            e_base = float(np.abs(base - loop).max() / np.abs(loop).max())
            assert e_ref < 1e-12 and e_base < 1e-12, (fmt, per_slot, e_ref, e_base)
            print(f"  {fmt} x {'(T, top, K)' if per_slot else '(T, K)'}: mul_mat_id_ref vs loop {e_ref:.1e}, "
                  f"sorted baseline vs loop {e_base:.1e}: ok")


def torch_baseline(torch, F, ids, m, device="cuda"):
    """fn(w16, xh, y16) for one routing: gather x in expert order, one F.linear per used expert, scatter into y16."""
    order, tokens, groups = sorted_plan(ids)
    order_d = torch.as_tensor(order, device=device)
    tokens_d = torch.as_tensor(tokens, device=device)

    def fn(w16, xh, y16):
        xs = xh.index_select(0, tokens_d)
        ys = torch.cat([F.linear(xs[a:b], w16[x_]) for x_, a, b in groups])
        y16.view(-1, m).index_copy_(0, order_d, ys)

    return fn


def run(args, fmts, tokens):
    torch = need_torch()

    res = {"device": torch.cuda.get_device_name(), "calls": CALLS, "cells": []}
    print(header())
    for fmt in fmts:
        for shape in SHAPES:
            res["cells"] += run_shape(torch, args, fmt, shape, tokens)
            torch.cuda.empty_cache()  # the shape's copies went with run_shape
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        plot(res, args.out.replace(".json", ".png"))


def run_shape(torch, args, fmt, shape, tokens):
    """One format and shape at each T: the weights' copies (enough for the T that reads the fewest bytes), then the
    cells; returns their rows."""
    import ptxgen.runtime as r
    from ptxgen.testing.strategies import random_raw

    e, top, m, k = shape
    eb = expert_bytes(fmt, m, k)
    routes = {t: routing(e, top, t) for t in tokens}
    used = {t: len(np.unique(ids)) for t, ids in routes.items()}
    raw = random_raw(fmt, e * m, k, np.random.default_rng(0))
    ws = [r.QuantTensor.from_raw(fmt, raw, (e, m, k)).to_device()
          for _ in range(max(copies_for(used[t] * eb) for t in tokens))]
    from ptxgen import codecs, formats
    if fmt in codecs.dequantizable():
        base16 = torch.as_tensor(r.dequantize(ws[0]), device="cuda")
    else:  # no GPU dequant kernel (TQ4_1S): the host reference, original domain, rounded to fp16
        base16 = torch.as_tensor(formats.dequantize(fmt, raw, (e * m, k)).reshape(e, m, k), device="cuda").half()
    w16s = [base16] + [base16.clone() for _ in range(max(copies_for(2 * used[t] * m * k) for t in tokens) - 1)]
    return [run_cell(torch, args, fmt, shape, t, routes[t], ws[:copies_for(used[t] * eb)],
                     w16s[:copies_for(2 * used[t] * m * k)]) for t in tokens]


def run_cell(torch, args, fmt, shape, t, ids_h, ws, w16s):
    """Check, then time one cell: ptxgen rotating over `ws`, the torch baseline over `w16s`; prints its row."""
    import torch.nn.functional as F

    import ptxgen.runtime as r
    from bench_op import eager, graphed, kernel_only
    from ptxgen.runtime import ops

    e, top, m, k = shape
    used, eb = len(np.unique(ids_h)), expert_bytes(fmt, m, k)
    ids = torch.as_tensor(ids_h, device="cuda")
    x = torch.randn(t, k, device="cuda", dtype=getattr(torch, args.x_dtype))
    y = torch.empty(t, top, m, device="cuda")
    xh = x.half()
    y16 = torch.empty(t, top, m, device="cuda", dtype=torch.float16)
    base = torch_baseline(torch, F, ids_h, m)
    r.mul_mat_id(ws[0], x, ids, out=y)
    base(w16s[0], xh, y16)
    torch.cuda.synchronize()
    err = float(((y.double() - y16.double()).norm() / y16.double().norm()).item())
    assert err < 2e-3, f"{fmt} {shape_name(*shape)} T={t}: relative error {err:.2e} against the fp16 baseline"
    call = lambda i: r.mul_mat_id(ws[i % len(ws)], x, ids, out=y)  # noqa: E731
    ours = {"kernel": kernel_only(torch, call, args.reps), "eager": eager(torch, call), "graph": graphed(torch, call)}
    peer_call = lambda i: base(w16s[i % len(w16s)], xh, y16)  # noqa: E731
    peer = {"eager": eager(torch, peer_call)}
    try:
        peer["graph"] = graphed(torch, peer_call)
    except RuntimeError as exc:  # not capturable: eager only
        peer["graph"], peer["graph_error"] = None, str(exc)[:200]
        torch.cuda.synchronize()
    llama = LLAMA[(e, top)].get(t) if fmt == "q4_K" else None
    floor = used * eb / HBM * 1e6
    g, met = goal(fmt, e, top, t, ours["graph"])
    row = {"fmt": fmt, "experts": e, "top": top, "m": m, "k": k, "T": t, "experts_used": used,
           "used_bytes": used * eb, "tensor_bytes": e * eb, "copies": len(ws), "fp16_copies": len(w16s),
           "kernels": ops.mul_mat_id_plan(ws[0], t, top, x_dtype=args.x_dtype).kernels, "x_dtype": args.x_dtype,
           "rel_err": err, "ptxgen": ours, "torch_fp16": peer,
           "llamacpp": llama, "floor_us": floor, "flop_floor_us": 2 * t * top * m * k / 989e12 * 1e6,
           "goal": g, "goal_met": met}
    pg = f"{peer['graph']:.1f}" if peer["graph"] is not None else "—"
    print(f"| {fmt} | {e}, top-{top}, {m}×{k} | {t} | {used} | {ours['kernel']:.1f} | "
          f"{ours['eager']:.1f} / {ours['graph']:.1f} | {peer['eager']:.1f} / {pg} | {llama or '—'} | "
          + (f"{llama / ours['graph']:.2f}× | " if llama else "— | ")
          + f"{floor:.1f} ({floor / ours['graph']:.2f}) | "
          + (f"{g}: {'✓' if met else '✗'} | " if g else "— | ") + f"{err:.1e} |", flush=True)
    return row


def plot(res, path):
    from bench_gemv import pyplot

    plt = pyplot()
    if plt is None:
        print("matplotlib missing: no plot")
        return
    from bench_op import log_axes, save_figure

    panels = list(dict.fromkeys((c["fmt"], c["experts"], c["top"], c["m"], c["k"]) for c in res["cells"]))
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (fmt, e, top, m, k) in zip(axes[0], panels):
        rows = [c for c in res["cells"] if (c["fmt"], c["experts"], c["top"], c["m"], c["k"]) == (fmt, e, top, m, k)]
        ts = [c["T"] for c in rows]
        for how, mark in (("kernel", "o"), ("eager", "s"), ("graph", "^")):
            ax.plot(ts, [c["ptxgen"][how] for c in rows], "-" + mark, label=f"ptxgen {how}")
        for how, mark in (("eager", "s"), ("graph", "^")):
            pts = [(c["T"], c["torch_fp16"][how]) for c in rows if c["torch_fp16"].get(how) is not None]
            if pts:
                ax.plot(*zip(*pts), ":" + mark, label=f"torch fp16 {how}")
        pts = [(c["T"], c["llamacpp"]) for c in rows if c["llamacpp"]]
        if pts:
            ax.plot(*zip(*pts), "-.x", label="llama.cpp")
        if fmt == "q4_K":
            lim = [(1, GOAL_T1[(e, top)]), (512, GOAL_T512[(e, top)])]
            lim += [(t, LLAMA[(e, top)][t] / GOAL_SPEEDUP) for t in GOAL_SPEEDUP_TOKENS]
            lim = [p for p in lim if p[0] in ts]
            if lim:
                ax.plot(*zip(*lim), "rv", linestyle="none", label="goal")
        ax.plot(ts, [c["floor_us"] for c in rows], "k--", label="floor")
        log_axes(ax, f"{fmt} {e} experts top-{top} {m}×{k}")
    save_figure(fig, axes, path)


if __name__ == "__main__":
    main()
