"""Decode GEMV benchmark (needs a GPU and torch): TQ4_1S (exact, separate vs fused rotation; fast), Q4_K
(exact fp32; fast = int8 x Q8_1) and Q8_0 (int8 x Q8_1) at T = 1, 2, 4, 8 on Qwen2.5-7B and Llama shapes,
against cuBLAS fp16 on dequantized weights, tinygemm, and llama.cpp's / the TurboQuant fork's figures from
shared/PERF.md (fixed columns, measured elsewhere on the same H200 model). The ratio columns are peer time
over ptxgen time (> 1: ptxgen faster) for ptxgen's exact and fast modes.

Timing: each call is bracketed by CUDA events behind a 0.5 ms torch.cuda._sleep, so the GPU never waits
for Python to enqueue (device time only; the host cost of a call is in bench_runtime); weights rotate through enough copies to exceed 4× the 60 MB L2, so they come from HBM;
median of --reps calls. Weight bytes / time gives GB/s; % is of the measured 4.27 TB/s copy bandwidth.
"""
import argparse
import json
import math

import numpy as np

from ptxgen.testing.strategies import random_raw  # noqa: F401 - bench_mmq and the probes take it from here

HBM = 4.27e12  # the H200's measured copy bandwidth, B/s (../shared/PERF.md): every benchmark's floor
SHAPES = [(3584, 3584), (4608, 3584), (18944, 3584), (3584, 18944), (4096, 14336), (14336, 4096)]
TOKENS = (1, 2, 4, 8)
# shared/PERF.md: the TurboQuant fork's tq4_1s (GGML_TQ_NATIVE=1) and llama.cpp MMVQ q4_K, µs per op
FORK_TQ4_1S = {((18944, 3584), 1): 21.9, ((18944, 3584), 8): 71.2, ((3584, 18944), 1): 23.6,
               ((3584, 18944), 8): 79.2, ((4608, 3584), 1): 10.7, ((3584, 3584), 1): 9.7}
LLAMA_Q8_0 = {((18944, 3584), 1): 40.1, ((18944, 3584), 8): 59.6, ((3584, 18944), 1): 29.5,
              ((3584, 18944), 8): 62.4, ((4608, 3584), 1): 15.1, ((3584, 3584), 1): 13.3,
              ((4096, 14336), 1): 23.0, ((4096, 14336), 8): 46.1}
LLAMA_Q4_K = {((18944, 3584), 1): 26.9, ((18944, 3584), 8): 96.0, ((3584, 18944), 1): 23.6,
              ((3584, 18944), 8): 89.6, ((4608, 3584), 1): 11.1, ((3584, 3584), 1): 10.0,
              ((4096, 14336), 1): 16.3, ((4096, 14336), 8): 67.1}


def probe_argv(default_reps, lead=1):
    """The probes' command line: `lead` leading arguments (default one: WHAT), then MxK,MxK,... T,T,... [reps] →
    (*leading, shapes, tokens, reps)."""
    import sys

    a = sys.argv[1:]
    shapes = [tuple(int(v) for v in s.split("x")) for s in a[lead].split(",")]
    reps = int(a[lead + 2]) if len(a) > lead + 2 else default_reps
    return (*a[:lead], shapes, [int(v) for v in a[lead + 1].split(",")], reps)


def zeroed_flag(r):
    """The MMQ launches' overflow flag (one u32, zero)."""
    flag = r.DeviceArray.empty((1,), np.uint32)
    flag.owner.fill_bytes(0)
    return flag


def ptx_function(r, text, entry, arch):
    """A loaded kernel from PTX text and its manifest entry (a build made in-process, an edited or an older
    emission), compiled as ptxgen.runtime.kernels.load compiles the emitted builds — the driver's whole-program
    JIT where the manifest says so (setmaxnreg honoured), nvJitLink otherwise — so probes compare like with like."""
    from ptxgen.arch import device_target, get_arch
    from ptxgen.runtime.compiler import compile_ptx
    from ptxgen.runtime.driver import Module

    name = entry["kernel"]
    if entry["meta"].get("compile") == "whole-program":
        mod = Module(text.encode() + b"\0", name)
    else:
        mod = Module(compile_ptx(text, device_target(get_arch(arch), r.current().sm), name=name).cubin, name)
    fn = mod.function(entry["entry"], entry["params"], entry["block"], entry.get("dynamic_smem", 0))
    fn.meta, fn.arch = entry["meta"], arch
    return fn


def weight_copies(r, fmt, raw, m, k):
    """QuantTensors of the same raw weights, enough copies to pass 4× the 60 MB L2: calls that rotate through
    them read their weights from HBM."""
    from ptxgen import formats

    copies = max(2, math.ceil(4 * 60e6 / (m * formats.get(fmt).row_bytes(k))))
    return [r.QuantTensor.from_raw(fmt, raw, (m, k)) for _ in range(copies)]


def probe_weights(r, fmt, shapes, seed=0):
    """The probes' loop over shapes: (m, k, raw, copies of the weights to rotate through) per shape."""
    rng = np.random.default_rng(seed)
    for m, k in shapes:
        raw = random_raw(fmt, m, k, rng)
        yield m, k, raw, weight_copies(r, fmt, raw, m, k)


def probe_cases(r, torch, fmt, shapes, tokens):
    """The probes' loop over shapes and token counts: (m, k, raw, weight copies (probe_weights), t, x, y) with
    fresh random fp32 x (T x K) and an empty y (T x M), torch tensors on the GPU."""
    for m, k, raw, ws in probe_weights(r, fmt, shapes):
        for t in tokens:
            yield (m, k, raw, ws, t, torch.randn(t, k, device="cuda", dtype=torch.float32),
                   torch.empty(t, m, device="cuda", dtype=torch.float32))


def mmq_checked(mmq_launch, w, x, y, t, flag, path, ref=None, arch="sm_89"):
    """One MMQ launch (ptxgen.runtime.ops.mmq_launch on DeviceArray views of torch x, y) on NaN-poisoned y, within
    1e-3 of the float64 `ref` where given; returns y's bits."""
    import ptxgen.runtime as r

    y.fill_(float("nan"))
    mmq_launch(w, r.as_device_array(x), r.as_device_array(y), t, flag, path=path, arch=arch)
    got = y.cpu().numpy()
    if ref is not None:
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err <= 1e-3, f"{path} T={t}: relative error {err:.2e}"
    return got.view(np.uint32).copy()


def kernel_times(torch, launch, reps, skip=("sleep",)):
    """Device µs per call of each kernel that `launch(i)` runs, by name (CUPTI through torch.profiler), over `reps`
    calls each behind a sleep; kernels whose name contains a `skip` string are left out."""
    from collections import defaultdict

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            torch.cuda._sleep(1_000_000)
            launch(i)
        torch.cuda.synchronize()
    per = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and not any(s in ev.name for s in skip):
            per[ev.name] += ev.device_time / reps
    return dict(per)


def timed(fn, reps, torch):
    out = []
    for i in range(reps):
        torch.cuda._sleep(1_000_000)  # ~0.5 ms: Python has long enqueued the call when the GPU reaches it
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(i)
        e.record()
        out.append((s, e))
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) * 1e3 for s, e in out]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--formats", default="tq4_1s,q4_K,q8_0", help="comma-separated subset of tq4_1s,q4_K,q8_0")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                    help="force a kernel choice, e.g. PTXGEN_MMQ_CX=0 (ptxgen/knobs.py LOWERING; repeatable)")
    args = ap.parse_args()
    from ptxgen import knobs

    knobs.set(**knobs.parse(args.knob))
    fmts = args.formats.split(",")
    if not set(fmts) <= {"tq4_1s", "q4_K", "q8_0"}:
        ap.error(f"--formats: unknown {sorted(set(fmts) - {'tq4_1s', 'q4_K', 'q8_0'})}")
    import torch

    import ptxgen.runtime as r
    from ptxgen import formats, knobs

    rng = np.random.default_rng(0)
    results = []
    shapes = SHAPES if args.shapes == "all" else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    for (m, k) in shapes:
        for fmt in fmts:
            f = formats.get(fmt)
            wbytes = m * f.row_bytes(k)
            raw = random_raw(fmt, m, k, rng)
            ws = weight_copies(r, fmt, raw, m, k)
            copies = len(ws)
            # correctness spot check of this very shape before timing it
            xs = rng.standard_normal((2, k)).astype(np.float32)
            if fmt == "q8_0":  # int8 x Q8_1 only: against the product with the Q8_1-rounded activation
                ref, got = formats.gemm_q8_1_ref(fmt, raw, m, k, xs), r.mul_mat(ws[0], xs, mode="fast")
            else:
                ref = formats.gemv_tq4_1s_ref(raw, m, k, xs) if fmt == "tq4_1s" else formats.gemm_ref(fmt, raw, m, k, xs)
                got = r.mul_mat(ws[0], xs)
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            w16 = None
            for t in TOKENS:
                x = torch.randn(t, k, device="cuda", dtype=torch.float32)
                y = torch.empty(t, m, device="cuda", dtype=torch.float32)
                row = {"fmt": fmt, "m": m, "k": k, "T": t, "weight_bytes": wbytes, "rel_err_T2": err}
                modes = {"separate": "separate", "fused": "fused"} if fmt == "tq4_1s" else {"gemv": "separate"}
                mode = "fast" if fmt == "q8_0" else "exact"  # q8_0: int8 x Q8_1 only
                for label, rot in modes.items():
                    us = timed(lambda i: r.mul_mat(ws[i % copies], x, out=y, rotation=rot, mode=mode), args.reps, torch)
                    row[f"us_{label}"] = us
                best = min(row[f"us_{k_}"] for k_ in modes)
                row["us"] = best
                row["GBps"] = wbytes / best / 1e3
                row["pct_hbm"] = 100 * wbytes / (best * 1e-6) / HBM
                if fmt == "tq4_1s":
                    row["us_fast"] = fast_us(r, ws, copies, x, y, m, k, t, args.reps, torch)
                    row["us_tc"] = tc_us(r, ws, copies, x, y, m, k, t, args.reps, torch)
                    if w16 is None:
                        deq = formats.dequantize(fmt, raw, (m, k)).astype(np.float16)
                        w16 = [torch.from_numpy(deq).cuda() for _ in range(max(2, math.ceil(4 * 60e6 / deq.nbytes)))]
                    xh = x.half()
                    row["us_cublas_fp16"] = timed(lambda i: torch.matmul(xh, w16[i % len(w16)].t()), args.reps, torch)
                    row["us_fork_tq4_1s"] = FORK_TQ4_1S.get(((m, k), t))
                elif fmt == "q8_0":
                    row["us_llamacpp_q8_0"] = LLAMA_Q8_0.get(((m, k), t))
                elif fmt == "q4_K":
                    row["us_fast"] = fast_us(r, ws, copies, x, y, m, k, t, args.reps, torch)
                    row["us_tc"] = tc_us(r, ws, copies, x, y, m, k, t, args.reps, torch)
                    # the mma.sync targets' build (cp.async instead of TMA), run here as sm_89 PTX, and the lane
                    # kernel mul_mat(arch="sm_89") would otherwise run (both tensor-core knobs off)
                    row["us_tc_sm89"] = tc_us(r, ws, copies, x, y, m, k, t, args.reps, torch, arch="sm_89")
                    with knobs.override(PTXGEN_Q4K_MMA="0", PTXGEN_Q4K_T1="0"):
                        row["us_lane_sm89"] = timed(lambda i: r.mul_mat(ws[i % copies], x, out=y, arch="sm_89"),
                                                    args.reps, torch)
                    row["us_llamacpp_q4_K"] = LLAMA_Q4_K.get(((m, k), t))
                    row["us_tinygemm"] = tinygemm_us(torch, m, k, t, args.reps)
                results.append(row)
                print_row(row)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
        plot(results, args.out.replace(".json", ".png"))


_HEADER = False


def print_row(row):
    global _HEADER
    if not _HEADER:
        print("| fmt | M×K | T | ptxgen µs | GB/s | % of 4.27 TB/s | sep / fused rot. µs | fast (dp4a) µs "
              "| tensor-core exact µs (forced, any T) | cuBLAS fp16 µs | tinygemm µs | llama.cpp/fork µs (PERF.md) "
              "| peer/ptxgen | peer/fast | sm_89 build: tensor-core / lane µs |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        _HEADER = True
    peer = row.get("us_fork_tq4_1s") or row.get("us_llamacpp_q4_K") or row.get("us_llamacpp_q8_0")
    f = lambda v: "n/a" if v is None else f"{v:.1f}"  # noqa: E731
    rot = f"{row['us_separate']:.1f} / {row['us_fused']:.1f}" if "us_fused" in row else "-"
    ratio = "n/a" if peer is None else f"{peer / row['us']:.2f}"
    fratio = "n/a" if peer is None or row.get("us_fast") is None else f"{peer / row['us_fast']:.2f}"
    print(f"| {row['fmt']} | {row['m']}×{row['k']} | {row['T']} | {row['us']:.1f} | {row['GBps']:.0f} | "
          f"{row['pct_hbm']:.0f}% | {rot} | {f(row.get('us_fast'))} | {f(row.get('us_tc'))} | {f(row.get('us_cublas_fp16'))} | "
          f"{f(row.get('us_tinygemm'))} | {f(peer)} | {ratio} | {fratio} | "
          f"{f(row.get('us_tc_sm89'))} / {f(row.get('us_lane_sm89'))} |", flush=True)


def tc_us(r, ws, copies, x, y, m, k, t, reps, torch, arch=None):
    """The tensor-core exact GEMV forced at every T ≤ 8 — TQ4_1S (PTXGEN_TQ4_MMA=1; sm_90), Q4_K
    (PTXGEN_Q4K_MMA=1; sm_90's TMA build, or with arch="sm_89" the cp.async build of the mma.sync targets) —
    checked against the float64 reference on this shape first; None where it does not run."""
    from ptxgen import formats, knobs
    from ptxgen.runtime import ops

    fmt = ws[0].fmt
    knob = {"tq4_1s": "PTXGEN_TQ4_MMA", "q4_K": "PTXGEN_Q4K_MMA"}[fmt]
    if not (ops._tma_ok(ws[0], arch, "gemv_tq4_1s_mma") if fmt == "tq4_1s"
            else ops._mma_build(arch, "gemv_q4_k_mma")):
        return None
    with knobs.override(**{knob: "1"}):
        xs = x[:1].cpu().numpy()
        raw = ws[0].raw().reshape(m, -1)
        ref = formats.gemv_tq4_1s_ref(raw, m, k, xs) if fmt == "tq4_1s" else formats.gemm_ref(fmt, raw, m, k, xs)
        err = np.linalg.norm(r.mul_mat(ws[0], xs, arch=arch) - ref) / np.linalg.norm(ref)
        if err > 1e-5:
            raise AssertionError(f"{fmt} tensor-core GEMV {m}x{k} ({arch or 'default'} build): relative error {err:.2e}")
        return timed(lambda i: r.mul_mat(ws[i % copies], x, out=y, arch=arch), reps, torch)


def fast_us(r, ws, copies, x, y, m, k, t, reps, torch):
    """Fast mode, whole op as users call it: mul_mat(mode="fast") = (rotate +) Q8_1 prep, dp4a GEMV."""
    try:
        xa, ya = r.as_device_array(x), r.as_device_array(y)
        return timed(lambda i: r.mul_mat(ws[i % copies], xa, out=ya, mode="fast"), reps, torch)
    except Exception as e:  # noqa: BLE001 - a benchmark column, not a test
        print(f"fast mode unavailable: {type(e).__name__}: {str(e)[:120]}")
        return None


def tinygemm_us(torch, m, k, t, reps):
    """torch._weight_int4pack_mm (W4A16, group 32, bf16): the tinygemm peer; n/a if this torch lacks it."""
    try:
        wq = torch.randint(0, 16, (m, k), dtype=torch.int32, device="cuda")
        packed = torch._convert_weight_to_int4pack(((wq[:, ::2] << 4) | wq[:, 1::2]).to(torch.uint8), 8)
        sz = torch.rand(k // 32, m, 2, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
        torch._weight_int4pack_mm(x, packed, 32, sz)
        return timed(lambda i: torch._weight_int4pack_mm(x, packed, 32, sz), reps, torch)
    except Exception as e:  # noqa: BLE001
        print(f"tinygemm unavailable: {type(e).__name__}: {str(e)[:120]}")
        return None


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None where matplotlib is missing (no plot then)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(results, path):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    for ax, fmt in zip(axes, ("tq4_1s", "q4_K", "q8_0")):
        for (m, k) in sorted({(r_["m"], r_["k"]) for r_ in results if r_["fmt"] == fmt}):
            rows = [r_ for r_ in results if r_["fmt"] == fmt and (r_["m"], r_["k"]) == (m, k)]
            line = ax.plot([r_["T"] for r_ in rows], [r_["GBps"] for r_ in rows], "o-", label=f"{m}×{k}")[0]
            if rows[0].get("us_fast"):
                ax.plot([r_["T"] for r_ in rows], [r_["weight_bytes"] / r_["us_fast"] / 1e3 for r_ in rows], "x--",
                        color=line.get_color(), label=f"{m}×{k} fast")
        ax.axhline(HBM / 1e9, color="k", ls="--", label="HBM copy 4.27 TB/s")
        ax.set_title(f"{fmt} decode GEMV on H200 (weight GB/s)")
        ax.set_xlabel("tokens T")
        ax.set_ylabel("GB/s")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
