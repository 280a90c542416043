"""Decode GEMVs in a graph-replayed decode loop (#36; needs a GPU and torch, except --dry-run): per format (Q4_K,
Q5_K, Q6_K, Q8_0, TQ4_1S), shape, mode and T = 1, 2, 4, 8, mul_mat over ≥ 24 distinct weights (from HBM, as in a
model) eager and graph-replayed, beside the same loop of a kernel that only reads the weights' bytes (the floor:
probe_decode_floor's, with PDL), of cuBLAS fp16 F.linear, and llama.cpp's figure (shared/PERF.md; TQ4_1S: the
TurboQuant fork's). Modes: exact, and fast where the format has a fast kernel — its codec routes the mode
(ptxgen.codecs ROUTES) and mul_mat plans other kernels than exact's for it (decode_loop.skip_reason); a cell
without one is printed as skipped, with the reason. Columns: µs per op eager and graph (no lead: the replay's host
submission inside), % of the 4.27 TB/s copy bandwidth, the floor's graph µs and ptxgen's throughput as % of the
floor's (floor ÷ graph), cuBLAS's graph µs and cuBLAS / ptxgen (> 1: ptxgen faster), llama.cpp's µs, the loop's
GPU-busy time under CUPTI (kernels only, for diagnosis) and the kernels. One table per format and shape; the
loop's code is decode_loop.py, which bench_op's decode loop runs too. --isolated adds one call at a time behind a
0.5 ms sleep (timed below: device time, the GPU idle between calls). Writes JSON (--out) and a PNG beside it.
--dry-run (no GPU, no torch): the header, each loop's caption and the cells it would run, with the kernels
mul_mat would launch on an H200 (captured) and llama.cpp's figure.

    python3 bench/bench_gemv.py --out bench/results/bench_gemv.json
    python3 bench/bench_gemv.py --formats q4_K,tq4_1s --tokens 1,8 --modes exact --dry-run

The rest of this module is the probes' shared setup (probe_argv, probe_cases, ptx_function, timed, ...).
"""
import argparse
import json
import math

import numpy as np

from ptxgen.testing.strategies import random_raw  # noqa: F401 - bench_mmq and the probes take it from here

H200_HBM = 4.27e12  # the H200's measured copy bandwidth, B/s (../shared/PERF.md)
H200_PEAK = 2 * 3.201e9 * 6144 / 8  # its DRAM peak from the driver's memory clock and bus width (4.92 TB/s)


def device_hbm() -> tuple[float, str]:
    """The copy bandwidth every benchmark's floor divides by, and a line saying where it comes from: the H200's
    measured 4.27 TB/s; on another GPU its DRAM peak (the driver's memory clock x bus width) times the H200's
    measured / peak ratio, an estimate (an H100 SXM: ~2.9 TB/s); without a GPU (--dry-run), the H200's."""
    try:
        from cuda.bindings import driver as drv

        from ptxgen.runtime import driver

        ctx = driver.current()
        if "H200" in ctx.name:
            return H200_HBM, f"{ctx.name}: floors at 4.27 TB/s (measured copy bandwidth)"
        attr = lambda a: driver.check(drv.cuDeviceGetAttribute(a, ctx.device), "cuDeviceGetAttribute")  # noqa: E731
        peak = 2 * attr(drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE) * 1e3 \
            * attr(drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH) / 8
        if peak > 0:
            bw = peak * H200_HBM / H200_PEAK
            return bw, (f"{ctx.name}: floors at {bw / 1e12:.2f} TB/s (an estimate: its DRAM peak {peak / 1e12:.2f} "
                        f"TB/s x the H200's measured / peak)")
    except Exception:  # no GPU, or a driver without these attributes: the H200's figure, said so
        pass
    return H200_HBM, "floors at the H200's 4.27 TB/s (this GPU's bandwidth not known)"


def need_torch():
    """torch, or an exit that says what to install (the benchmarks time the op as torch calls it, beside cuBLAS)."""
    try:
        import torch
    except ModuleNotFoundError:
        raise SystemExit("the benchmarks need torch and a GPU: pip install -e \".[bench]\" (--dry-run needs neither "
                         "where a benchmark has it)") from None
    return torch


HBM, HBM_NOTE = device_hbm()  # every benchmark's floor (bench_mmq, bench_model, bench_moe import it)
SHAPES = [(3584, 3584), (4608, 3584), (18944, 3584), (3584, 18944), (4096, 14336), (14336, 4096)]  # --shapes all
FORMATS = ("q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s")


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


def parse(argv=None):
    """The command line → its namespace, lists parsed: formats, shapes ([(M, K)], or None: each format's default,
    decode_loop.SHAPES), tokens, modes."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))  # the first paragraph
    ap.add_argument("--out", default=None)
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated subset of {','.join(FORMATS)}")
    ap.add_argument("--shapes", default=None, help="MxK,MxK,... for every format (default: each format's, "
                    "decode_loop.SHAPES); 'all': " + ",".join(f"{m}x{k}" for m, k in SHAPES))
    ap.add_argument("--tokens", default="1,2,4,8", help="comma-separated T")
    ap.add_argument("--modes", default="exact,fast",
                    help="comma-separated; each format runs those it has kernels for (decode_loop.skip_reason)")
    ap.add_argument("--isolated", action="store_true",
                    help="also time one call at a time behind a 0.5 ms sleep (bench_op.kernel_only)")
    ap.add_argument("--reps", type=int, default=30, help="--isolated: samples per cell")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: the header and the cells that would run")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                    help="force a kernel choice, e.g. PTXGEN_MMQ_CX=0 (ptxgen/knobs.py LOWERING; repeatable)")
    ap.add_argument("--rule", action="append", default=[], metavar="NAME=JSON",
                    help="a dispatch rule of ptxgen/tuning overridden for this run, e.g. q4k_mma_t1_min_weights=0")
    args = ap.parse_args(argv)
    args.formats = args.formats.split(",")
    if not set(args.formats) <= set(FORMATS):
        ap.error(f"--formats: unknown {sorted(set(args.formats) - set(FORMATS))}")
    args.modes = args.modes.split(",")
    if not set(args.modes) <= {"exact", "fast"}:
        ap.error(f"--modes: unknown {sorted(set(args.modes) - {'exact', 'fast'})}")
    try:
        args.tokens = [int(v) for v in args.tokens.split(",")]
        args.shapes = (None if args.shapes is None else SHAPES if args.shapes == "all"
                       else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")])
    except ValueError as e:
        ap.error(f"--tokens / --shapes: {e}")
    if min(args.tokens) < 1 or any(len(s) != 2 for s in args.shapes or ()):
        ap.error("--tokens: T ≥ 1; --shapes: MxK,MxK,...")
    return args


def cases(args) -> list:
    """(fmt, M, K) of each loop, in order: per format, --shapes or its default shapes."""
    from decode_loop import SHAPES as DEFAULT

    return [(fmt, m, k) for fmt in args.formats for m, k in (args.shapes or DEFAULT[fmt])]


def main(argv=None):
    args = parse(argv)
    print(HBM_NOTE)
    from ptxgen import knobs, tuning

    knobs.set(**knobs.parse(args.knob))
    tuning.set(**{n: json.loads(v) for n, v in (a.split("=", 1) for a in args.rule)})
    if args.dry_run:
        return dry_run(args)
    torch = need_torch()

    import decode_loop

    rows = decode_loop.run(torch, cases(args), args.tokens, args.modes,
                           isolated_reps=args.reps if args.isolated else 0)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
        plot(rows, args.out.replace(".json", ".png"))


def dry_run(args):
    """The header, then per loop its caption and a line per cell: the kernels mul_mat would launch when captured on
    an H200 (ptxgen.testing.fakegpu), or why the run would skip the cell (decode_loop.skip_reason), and llama.cpp's
    figure."""
    import pytest

    from decode_loop import caption, header, llama_us, routed_modes, skip_reason
    from ptxgen.runtime import ops
    from ptxgen.testing import fakegpu

    print(header(args.isolated))
    with pytest.MonkeyPatch.context() as mp:
        fakegpu.install(mp)
        for fmt, m, k in cases(args):
            print(f"\n{caption(fmt, m, k, args.modes)}")
            for mode in routed_modes(fmt, args.modes):
                for t in args.tokens:
                    kernels_of = lambda md: ops.choose(fmt, md, None, t, m, k, graph=True).kernels  # noqa: E731
                    reason = skip_reason(kernels_of, fmt, t, mode)
                    plan = (f"skipped: {reason}" if reason
                            else "kernels " + " + ".join(dict.fromkeys(kernels_of(mode))))
                    llama = llama_us(fmt, m, k, t)
                    llama = "—" if llama is None else f"{llama} µs"
                    print(f"  {fmt} {m}×{k} {mode} T={t}: {plan}; llama.cpp {llama}")


def plot(rows, path):
    """A panel per format and shape: µs per op against T, ptxgen graph-replayed per mode beside the floor, cuBLAS
    fp16 and llama.cpp."""
    plt = pyplot()
    if plt is None:
        print("matplotlib missing: no plot")
        return
    from bench_op import log_axes, save_figure

    rows = [row for row in rows if "skipped" not in row]
    panels = list(dict.fromkeys((row["fmt"], row["m"], row["k"]) for row in rows))
    if not panels:
        return
    ncols = min(4, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 4 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, panel in zip(axes.flat, panels):
        mine = [row for row in rows if (row["fmt"], row["m"], row["k"]) == panel]
        for mode in dict.fromkeys(row["mode"] for row in mine):
            pts = [(row["T"], row["ptxgen"]["graph"]) for row in mine if row["mode"] == mode]
            ax.plot(*zip(*pts), "-o", label=f"ptxgen {mode} graph")
        first = [row for row in mine if row["mode"] == mine[0]["mode"]]  # the peers: once a T
        for key, style, label in (("floor_graph", "k--", "floor (read only, PDL)"),
                                  ("cublas_fp16", "g:s", "cuBLAS fp16 graph"), ("llamacpp", "r-.x", "llama.cpp")):
            pts = [(row["T"], row[key]["graph"] if key == "cublas_fp16" else row[key]) for row in first
                   if row[key] is not None]
            if pts:
                ax.plot(*zip(*pts), style, label=label)
        log_axes(ax, "{} {}×{}".format(*panel))
    save_figure(fig, axes, path)


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


if __name__ == "__main__":
    main()
