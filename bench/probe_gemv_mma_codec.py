"""One codec tensor-core GEMV op (prep_mma_f16 + gemv_<fmt>_mma) on fresh weights, repeated: a target for ncu.

    ncu -k regex:gemv_q6_k_mma -c 1 --section WarpStateStats python3 bench/probe_gemv_mma_codec.py --tokens 1
"""
import argparse

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmt", default="q6_K")
    ap.add_argument("--shape", default="4096x14336")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    import torch

    import ptxgen.runtime as r
    from ptxgen import tuning
    from ptxgen.testing.strategies import random_raw

    m, k = map(int, args.shape.split("x"))
    rng = np.random.default_rng(0)
    w = r.QuantTensor.from_raw(args.fmt, random_raw(args.fmt, m, k, rng), (m, k))
    x = torch.randn(args.tokens, k, device="cuda")
    y = torch.empty(args.tokens, m, device="cuda")
    tuning.set(codec_mma_min_tokens=1)
    print(r.mul_mat_plan(w, args.tokens).kernels)
    for _ in range(args.calls):
        r.mul_mat(w, x, out=y)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
