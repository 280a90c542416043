"""Probe: the codec GEMV (kernels/gemv_codec.py) built in-process with other (rows per warp, groups per step,
prefetch steps ahead) than the shipped SHAPE / AHEAD, timed back to back over 24 distinct weights (from HBM, as a
decode loop runs them) beside the read floor (torch's sum over the same bytes, same loop). Each variant's result
must be bit-identical to the first's (every variant adds in K order). Prints µs per op, % of 4.27 TB/s.
Usage: probe_gemv_codec.py FMT,... MxK,... T,... VARIANTS  (VARIANTS: R:U:A[:W];..., e.g. "2:2:2:0;2:1:2:1": rows,
groups per step, prefetch steps, W = 1 for the codec's wide lanes where it has them (Q6_K), 0 for the 8-weight ones).
Variants with other lanes are compared to the first within 1e-5 instead of bit for bit (other summation order)."""
import sys

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import HBM, ptx_function
from bench_op import eager
from ptxgen import formats
from ptxgen.arch import get_arch
from ptxgen.kernels import gemv_codec
from ptxgen.testing.strategies import random_raw

fmts, shapes, tokens, variants = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3].split(","), sys.argv[4]
variants = [tuple(int(v) for v in s.split(":")) + (None,) * (4 - len(s.split(":"))) for s in variants.split(";")]
N, CALLS = 24, 96
arch = "sm_90a" if torch.cuda.get_device_capability()[0] == 9 else "sm_89"


def back_to_back(fn):
    """µs per call of fn(i), i = 0 .. CALLS - 1, issued back to back (bench_op.eager, median of 5 rounds)."""
    fn(0)
    return eager(torch, fn, calls=CALLS, rounds=5)


print("| fmt | M×K | T | rows:unroll:ahead:wide | µs per op | % HBM | floor µs | ÷ floor |")
print("|---|---|---|---|---|---|---|---|")
for fmt in fmts:
    for shape in shapes:
        m, k = (int(v) for v in shape.split("x"))
        raw = random_raw(fmt, m, k, np.random.default_rng(0))
        nbytes = m * formats.get(fmt).row_bytes(k)
        ws = [torch.from_numpy(raw.reshape(-1).view(np.uint8)).cuda() for _ in range(N)]
        views = [w.view(torch.float32) if nbytes % 4 == 0 else w for w in ws]
        floor = back_to_back(lambda i: views[i % N].sum())
        stream = torch.cuda.current_stream().cuda_stream
        for t in (int(v) for v in tokens):
            x = torch.randn(t, k, device="cuda")
            y = torch.empty(t, m, device="cuda")
            nt = next(v for v in gemv_codec.TOKENS if v >= t)
            first = None
            for rows, unroll, ahead, wide in variants:
                k_ = gemv_codec.build(get_arch(arch), fmt, nt, shape=(rows, unroll), ahead=ahead,
                                      wide=None if wide is None else bool(wide))
                text = k_.ptx()
                fn = ptx_function(r, text, k_.manifest(text), arch)
                grid = (-(-m // (gemv_codec.WARPS * rows)),)
                run = lambda i: fn.launch(grid, (ws[i % N].data_ptr(), x.data_ptr(), y.data_ptr(), m, k, t),  # noqa: E731
                                          stream=stream)
                y.fill_(float("nan"))
                run(0)
                got = y.clone()
                if first is None:
                    first = got
                    want = formats.gemm_ref(fmt, raw, m, k, x.cpu().numpy())
                    rel = np.linalg.norm(got.cpu().numpy() - want) / np.linalg.norm(want)
                    assert rel < 1e-5, f"{fmt} {shape} T={t}: relative error {rel:.2e}"
                same = torch.equal(got.view(torch.int32), first.view(torch.int32)) or (
                    wide != variants[0][3] and float((got - first).norm() / first.norm()) < 1e-5)  # other lanes: 1e-5
                us = back_to_back(run)
                print(f"| {fmt} | {shape} | {t} | {rows}:{unroll}:{ahead}:{wide} | {us:.1f} | "
                      f"{100 * nbytes / (us * 1e-6) / HBM:.0f}% | {floor:.1f} | {us / floor:.2f}"
                      + ("" if same else " | DIFFERS from the first variant") + " |", flush=True)
