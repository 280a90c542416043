"""Probe: mul_mat_id's one-token GEMV (gemv_<fmt>_f32_id: grid (row blocks, pairs), each pair reads its expert)
built in-process with other (rows per warp, groups per step, wide lanes) than the shipped shape, on bench_moe's
shapes at T tokens, weights rotated over copies as bench_moe does (from HBM), graph-replayed (bench_op.graphed) as
bench_moe's graph column. Each variant is checked against float64 (1e-5). Prints µs per call and the read floor.

    python3 bench/probe_moe_pair.py FMT,... T,... VARIANTS   (VARIANTS: R:U:W;... e.g. "2:2:1;1:4:1")
"""
import sys

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import HBM, ptx_function
from bench_moe import SHAPES, copies_for, expert_bytes, routing
from bench_op import graphed
from ptxgen import formats
from ptxgen.arch import get_arch
from ptxgen.kernels import gemv_codec
from ptxgen.testing.strategies import random_raw

fmts, tokens = sys.argv[1].split(","), [int(v) for v in sys.argv[2].split(",")]
variants = [tuple(int(v) for v in s.split(":")) for s in sys.argv[3].split(";")]
arch = "sm_90a" if torch.cuda.get_device_capability()[0] == 9 else "sm_89"
print("| fmt | experts, top, M×K | T | rows:unroll:wide | graph µs per call | floor µs | ÷ floor | rel. err |")
print("|---|---|---|---|---|---|---|---|")
for fmt in fmts:
    for e, top, m, k in SHAPES:
        raw = random_raw(fmt, e * m, k, np.random.default_rng(0))
        eb = expert_bytes(fmt, m, k)
        for t in tokens:
            ids = routing(e, top, t)
            used = len(np.unique(ids)) * eb
            n = copies_for(used)
            ws = [torch.from_numpy(raw.reshape(-1).view(np.uint8)).cuda() for _ in range(n)]
            x = torch.randn(t, k, device="cuda")
            y = torch.empty(t, top, m, device="cuda")
            it = torch.from_numpy(ids).cuda()
            want = formats.mul_mat_id_ref(fmt, raw, (e, m, k), x.cpu().numpy(), ids)
            floor = used / HBM * 1e6
            for rows, unroll, wide in variants:
                kd = gemv_codec.build(get_arch(arch), fmt, 1, shape=(rows, unroll), moe="pair", wide=bool(wide))
                text = kd.ptx()
                fn = ptx_function(r, text, kd.manifest(text), arch)
                grid = (-(-m // (gemv_codec.WARPS * rows)), t * top)
                run = lambda i: fn.launch(grid, (ws[i % n].data_ptr(), x.data_ptr(), y.data_ptr(), m, k, 1, e, eb,  # noqa: E731
                                                 it.data_ptr(), top, 0), stream=torch.cuda.current_stream().cuda_stream)
                y.fill_(float("nan"))
                run(0)
                got = y.cpu().numpy().astype(np.float64)
                rel = np.linalg.norm(got - want) / np.linalg.norm(want)
                us = graphed(torch, run, calls=100, rounds=5)
                print(f"| {fmt} | {e}, top-{top}, {m}×{k} | {t} | {rows}:{unroll}:{wide} | {us:.1f} | {floor:.1f} | "
                      f"{us / floor:.2f} | {rel:.1e} |", flush=True)
