"""Probe for ncu: a few mul_mat calls of one format and shape, under dispatch rules given on the command line, and
optionally one cuBLAS fp16 F.linear on the same shape (replaces probe_q8_ncu.py and probe_f16a.py, 2026-12-07):

    ncu --kernel-name regex:f16a --launch-skip 2 --launch-count 1 python3 bench/probe_ncu_gemm.py q8_0 4096 14336 4096 \\
        float32 --rule mmq_f16a=true --rule mmq_pre_min_tokens=1 \\
        --rule 'codec_ra_mmq_max_tokens={"q5_K": 8, "q6_K": 8, "q8_0": 8, "tq4_1s": 8}'
    ncu -k regex:'mmq_q8_0|nvjet|sm90|gemm' ... python3 bench/probe_ncu_gemm.py q8_0 4096 14336 4096 float16 --cublas
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

from bench_gemv import need_torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("fmt")
    ap.add_argument("m", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("t", type=int)
    ap.add_argument("x_dtype", choices=("float32", "float16"))
    ap.add_argument("--rule", action="append", default=[], metavar="NAME=JSON", help="a dispatch rule (repeatable)")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--cublas", action="store_true", help="then one F.linear on random fp16 weights of the shape")
    args = ap.parse_args()
    torch = need_torch()
    import torch.nn.functional as F

    import ptxgen.runtime as r
    from ptxgen import tuning
    from ptxgen.testing.strategies import random_raw

    w = r.QuantTensor.from_raw(args.fmt, random_raw(args.fmt, args.m, args.k, np.random.default_rng(0)),
                               (args.m, args.k)).to_device()
    x = torch.randn(args.t, args.k, device="cuda", dtype=getattr(torch, args.x_dtype))
    y = torch.empty(args.t, args.m, device="cuda")
    with tuning.override(**{n: json.loads(v) for n, v in (a.split("=", 1) for a in args.rule)}):
        print(r.mul_mat_plan(w, args.t, x_dtype=args.x_dtype).kernels, flush=True)
        for _ in range(args.calls):
            r.mul_mat(w, x, out=y)
    if args.cublas:
        F.linear(x.half(), torch.randn(args.m, args.k, device="cuda", dtype=torch.float16) * 0.02)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
