"""The decode loop of #36, one code for bench_gemv's table and bench_op's decode loop (needs a GPU and torch to time;
the plan and the table's text need neither): mul_mat over ≥ 24 distinct weights of one format and shape, eager and
graph-replayed, beside the same loop of a kernel that only reads those weights' bytes (probe_decode_floor's, with
PDL: the floor), of cuBLAS fp16 F.linear on as many fp16 weights, and llama.cpp's figure (shared/PERF.md).

Each cell (format, shape, mode, T) times, in a row: ptxgen's loop eager and graph-replayed (behind bench_op's lead,
and without it), its GPU-busy time in one more profiled replay (the kernels' time, for diagnosis), the floor's loop
(PDL and plain) and F.linear's loop (eager and graph), each loop 4 × the weights' count calls (bench_op's eager /
graphed / graph_busy). Before timing, the first call's result is checked against the float64 product with the
dequantized weights (formats.gemm_ref; TQ4_1S: gemv_tq4_1s_ref) on the host; a cell off by ERROR_BOUND or more is
printed as skipped, with its error."""
import math
from typing import NamedTuple

import numpy as np

from bench_gemv import HBM
from bench_op import L2, eager, graph_busy, graphed, kernel_only

WEIGHTS = 24  # distinct weights a loop rotates over, at least: more where 24 copies would not pass 4× the L2
TOKENS = (1, 2, 4, 8)
MODES = ("exact", "fast")
# the loop's shapes per format (#36's; TQ4_1S also Qwen2.5-7B's attention shapes, where the fork has figures);
# bench_op's decode loop runs each format's first
SHAPES = {fmt: ((4096, 14336), (14336, 4096)) for fmt in ("q4_K", "q5_K", "q6_K", "q8_0")}
SHAPES["tq4_1s"] = ((18944, 3584), (3584, 18944), (4608, 3584), (3584, 3584))
# llama.cpp's decode GEMV (MMVQ), µs per op, shared/PERF.md: {fmt: {(M, K): {T: µs}}}. test-backend-ops MUL_MAT on
# the same H200 model, fp32 activations, its Q8_1 quantize kernel inside; 4096×14336 from its own table (weights may
# stay in L2 where they fit), the Qwen shapes from the TurboQuant fork's (weights from HBM; TQ4_1S: the fork's kernel)
LLAMA = {"q4_K": {(4096, 14336): {1: 16.3, 8: 67.1}, (18944, 3584): {1: 26.9, 8: 96.0},
                  (3584, 18944): {1: 23.6, 8: 89.6}, (4608, 3584): {1: 11.1}, (3584, 3584): {1: 10.0}},
         "q5_K": {(4096, 14336): {1: 18.7, 8: 70.2}},
         "q6_K": {(4096, 14336): {1: 28.4, 8: 62.4}},
         "q8_0": {(4096, 14336): {1: 23.0, 8: 46.1}, (18944, 3584): {1: 40.1, 8: 59.6},
                  (3584, 18944): {1: 29.5, 8: 62.4}, (4608, 3584): {1: 15.1}, (3584, 3584): {1: 13.3}},
         "tq4_1s": {(18944, 3584): {1: 21.9, 8: 71.2}, (3584, 18944): {1: 23.6, 8: 79.2}, (4608, 3584): {1: 10.7},
                    (3584, 3584): {1: 9.7}}}
# the result check's bound on the relative error against the float64 product: exact's as bench_op's op table; fast
# rounds x to Q8_1 (~0.5% at random x; TQ4_1S's int8 codebook adds its own)
ERROR_BOUND = {"exact": 2e-3, "fast": 2e-2}
COLUMNS = ("fmt", "M×K", "mode", "T", "ptxgen eager µs", "ptxgen graph µs (no lead)", f"% of {HBM / 1e12:.2f} TB/s (graph)",
           "floor graph µs (PDL; plain)", "% of floor (floor ÷ graph)", "cuBLAS fp16 graph µs", "cuBLAS / ptxgen",
           "llama.cpp µs", "busy µs (graph ÷ busy)", "kernels (graph; eager where they differ)")
ISOLATED = "isolated µs"  # with isolated timing: before the kernels


def llama_us(fmt: str, m: int, k: int, t: int) -> float | None:
    return LLAMA.get(fmt, {}).get((m, k), {}).get(t)


def routed_modes(fmt: str, wanted=MODES) -> tuple:
    """The modes of `wanted` that the format's codec routes (ptxgen.codecs ROUTES: mul_mat has kernels for them)."""
    from ptxgen import codecs

    return tuple(mode for mode in wanted if mode in codecs.get(fmt).ROUTES)


def skip_reason(kernels_of, fmt: str, t: int, mode: str) -> str | None:
    """Why the cell is not timed, or None. `kernels_of(mode)`: the kernels mul_mat plans for the cell in that mode
    (captured). Skipped: where planning raises for the mode (no kernel for this shape or GPU), and a mode other than
    exact that plans exact's kernels (a codec falls back to its exact routes where it has no kernel of the mode)."""
    from ptxgen.runtime import CompileError

    try:
        mine = kernels_of(mode)
        if mode == "exact" or mine != kernels_of("exact"):
            return None
    except (ValueError, NotImplementedError, CompileError) as e:  # KernelNotFound is a ValueError
        return f"mul_mat raised {type(e).__name__}: {e}"
    return f"plans exact's kernels ({' + '.join(dict.fromkeys(mine))}): no {mode} kernel for {fmt} at T={t}"


def weight_bytes(fmt: str, m: int, k: int) -> int:
    from ptxgen import formats

    return m * formats.get(fmt).row_bytes(k)


def copies(nbytes: int) -> int:
    """Distinct weights of `nbytes` a loop rotates over: WEIGHTS, or enough to pass 4× the L2."""
    return max(WEIGHTS, math.ceil(4 * L2 / nbytes))


def caption(fmt: str, m: int, k: int, wanted=MODES) -> str:
    """The line above a loop's table: the weights, the calls, the modes (and those the format has no route for)."""
    nbytes = weight_bytes(fmt, m, k)
    n = copies(nbytes)
    modes = routed_modes(fmt, wanted)
    missing = [mode for mode in wanted if mode not in modes]
    return (f"decode loop: {n} distinct {fmt} {m}×{k} weights ({nbytes / 1e6:.1f} MB each, {nbytes / HBM * 1e6:.1f} "
            f"µs at {HBM / 1e12:.2f} TB/s), {4 * n} calls a loop, µs per op; modes: {', '.join(modes) or 'none'}"
            + (f" (no {', '.join(missing)} route for {fmt})" if missing else ""))


def header(isolated: bool = False) -> str:
    cols = COLUMNS[:-1] + ((ISOLATED,) if isolated else ()) + COLUMNS[-1:]
    return "| " + " | ".join(cols) + " |\n" + "|---" * len(cols) + "|"


def _us(v) -> str:
    return "—" if v is None or v != v else f"{v:.1f}"  # v != v: NaN


def _ratio(a, b, fmt: str) -> str:
    return "—" if a is None or b is None or a != a or b != b else format(a / b, fmt)


def table_row(row: dict, isolated: bool = False) -> str:
    """One row of the table from a cell's timings (measure's dict): the ratios are computed here."""
    cells = [row["fmt"], f"{row['m']}×{row['k']}", row["mode"], str(row["T"])]
    width = len(COLUMNS) + isolated
    if "skipped" in row:
        cells.append("skipped: " + row["skipped"].replace("|", "/").replace("\n", " "))
        return "| " + " | ".join(cells + [""] * (width - len(cells))) + " |"
    ours, peer, floor = row["ptxgen"], row["cublas_fp16"], row["floor_graph"]
    g = ours["graph"]
    kernels = " + ".join(dict.fromkeys(row["kernels"]))
    if row["eager_kernels"] != row["kernels"]:
        kernels += f" (eager: {' + '.join(dict.fromkeys(row['eager_kernels']))})"
    cells += [_us(ours["eager"]), f"{_us(g)} ({_us(ours['graph_nolead'])})",
              _ratio(100 * row["weight_bytes"] / HBM * 1e6, g, ".0f") + "%",
              "—" if floor is None else f"{_us(floor)} ({_us(row['floor_plain_graph'])})",
              "—" if floor is None else _ratio(100 * floor, g, ".0f") + "%",
              _us(peer["graph"]), _ratio(peer["graph"], g, ".2f") + "×", _us(row["llamacpp"]),
              f"{_us(ours['graph_busy'])} ({_ratio(g, ours['graph_busy'], '.2f')})"]
    if isolated:
        cells.append(_us(ours.get("isolated")))
    return "| " + " | ".join(cells + [kernels]) + " |"


def read_floor_kernels(torch, ws, nbytes):
    """(plain, PDL) fn(i) launching probe_decode_floor's streaming kernel over the bytes of ws[i % len(ws)] on
    torch's current stream — #36's floor: with PDL each launch reads while the previous one finishes, as the GEMVs
    do (H200, 4096x14336 Q4_K's 33 MB: 9.7 µs plain, 7.3 with PDL; probe_decode_floor_2026-12-02.log); (None, None)
    off sm_90 (its PTX is sm_90a's: griddepcontrol)."""
    from probe_decode_floor import floor_fn

    if torch.cuda.get_device_capability()[0] != 9:
        return None, None
    ptrs = [w.ptr for w in ws]
    return floor_fn(torch, ptrs, nbytes, False), floor_fn(torch, ptrs, nbytes, True)


class Loop(NamedTuple):
    """One format and shape's loop: distinct copies of random weights on the GPU (QuantTensors), as many random fp16
    weights for F.linear, the floor's launchers over the quantized copies, and x (the largest T's rows, fp32 on the
    host) with the float64 product the first call of each cell is checked against."""
    fmt: str
    m: int
    k: int
    nbytes: int
    ws: list
    w16: list
    floor: tuple
    x: np.ndarray
    ref: np.ndarray


def loop_weights(torch, fmt: str, m: int, k: int, rng, tokens=TOKENS) -> Loop:
    import ptxgen.runtime as r
    from ptxgen import formats
    from ptxgen.testing.strategies import random_raw

    raw = random_raw(fmt, m, k, rng)
    nbytes = weight_bytes(fmt, m, k)
    n = copies(nbytes)
    x = rng.standard_normal((max(tokens), k)).astype(np.float32)
    ref = formats.gemv_tq4_1s_ref(raw, m, k, x) if fmt == "tq4_1s" else formats.gemm_ref(fmt, raw, m, k, x)
    ws = [r.QuantTensor.from_raw(fmt, raw, (m, k)).to_device() for _ in range(n)]
    w16 = [torch.randn(m, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(n)]
    return Loop(fmt, m, k, nbytes, ws, w16, read_floor_kernels(torch, ws, nbytes), x, ref)


def measure(torch, loop: Loop, t: int, mode: str, isolated_reps: int = 0) -> dict:
    """One cell: the loop of mul_mat(mode=mode) over the weights with T = t, beside the floor's and F.linear's loops
    (module docstring); `isolated_reps` > 0: also one call at a time behind a sleep, median of that many
    (bench_op.kernel_only). A cell that skip_reason skips, or whose result is off by ERROR_BOUND or more, has the
    reason under "skipped" and nothing timed."""
    import torch.nn.functional as F

    import ptxgen.runtime as r

    n, calls = len(loop.ws), 4 * len(loop.ws)
    row = {"fmt": loop.fmt, "m": loop.m, "k": loop.k, "T": t, "mode": mode, "weights": n, "calls": calls,
           "weight_bytes": loop.nbytes, "llamacpp": llama_us(loop.fmt, loop.m, loop.k, t)}
    reason = skip_reason(lambda md: r.mul_mat_plan(loop.ws[0], t, mode=md, graph=True).kernels, loop.fmt, t, mode)
    if reason:
        return {**row, "skipped": reason}
    kernels = {g: r.mul_mat_plan(loop.ws[0], t, mode=mode, graph=g).kernels for g in (False, True)}
    x = torch.as_tensor(loop.x[:t]).cuda()
    ys = [torch.empty(t, loop.m, device="cuda") for _ in range(n)]
    r.mul_mat(loop.ws[0], x, out=ys[0], mode=mode)
    ref = loop.ref[:t]
    err = float(np.linalg.norm(ys[0].cpu().numpy() - ref) / np.linalg.norm(ref))
    if not err < ERROR_BOUND[mode]:  # a wrong result is not timed; the other cells still are
        return {**row, "rel_err": err, "skipped": f"relative error {err:.2e} against the float64 product, over "
                                                  f"{ERROR_BOUND[mode]:g}: not timed"}
    call = lambda i: r.mul_mat(loop.ws[i % n], x, out=ys[i % n], mode=mode)  # noqa: E731
    ours = {"eager": eager(torch, call, calls=calls), "graph": graphed(torch, call, calls=calls),
            "graph_nolead": graphed(torch, call, calls=calls, lead_first=False)}
    ours["graph_profiled"], ours["graph_busy"] = graph_busy(torch, call, calls=calls)
    if isolated_reps:
        ours["isolated"] = kernel_only(torch, call, isolated_reps)
    plain, floor = (None if fn is None else graphed(torch, fn, calls=calls) for fn in loop.floor)
    xh = x.half()
    lin = lambda i: F.linear(xh, loop.w16[i % n])  # noqa: E731
    peer = {"eager": eager(torch, lin, calls=calls), "graph": graphed(torch, lin, calls=calls)}
    return {**row, "rel_err": err, "ptxgen": ours, "floor_graph": floor, "floor_plain_graph": plain,
            "floor_kernel": "read16_pdl (probe_decode_floor)", "cublas_fp16": peer,
            "kernels": kernels[True], "eager_kernels": kernels[False]}


def run(torch, cases, tokens=TOKENS, modes=MODES, rng=None, isolated_reps: int = 0) -> list:
    """Each (fmt, m, k) of `cases`: its loop's weights, caption and table, a row per routed mode and T; the rows."""
    rng = np.random.default_rng(0) if rng is None else rng
    rows = []
    for fmt, m, k in cases:
        loop = loop_weights(torch, fmt, m, k, rng, tokens)
        print(f"\n{caption(fmt, m, k, modes)}\n{header(isolated_reps > 0)}", flush=True)
        for mode in routed_modes(fmt, modes):
            for t in tokens:
                rows.append(measure(torch, loop, t, mode, isolated_reps))
                print(table_row(rows[-1], isolated_reps > 0), flush=True)
        del loop
        torch.cuda.empty_cache()
    return rows
