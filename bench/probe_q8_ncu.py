"""Probe: one Q8_0 4096x14336 T = 4096 mul_mat (fp16 x) and one cuBLAS fp16 F.linear on the same shape, for ncu
(#34's Q8_0 T = 4096 cell: ours ~800-830 µs in a loop against cuBLAS's ~710). Run under
`ncu -k regex:'mmq_q8_0|nvjet|sm90|gemm' --section SpeedOfLight --section WarpStateStats ... python3 bench/probe_q8_ncu.py`.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

from bench_gemv import need_torch  # noqa: E402


def main():
    torch = need_torch()
    import torch.nn.functional as F

    import ptxgen.runtime as r
    from ptxgen.testing.strategies import random_raw

    m, k, t = 4096, 14336, 4096
    rng = np.random.default_rng(0)
    xh = torch.randn(t, k, device="cuda").half()
    y = torch.empty(t, m, device="cuda")
    w16 = torch.randn(m, k, device="cuda", dtype=torch.float16) * 0.02
    wq = r.QuantTensor.from_raw("q8_0", random_raw("q8_0", m, k, rng), (m, k)).to_device()
    print(r.mul_mat_plan(wq, t, x_dtype="float16").kernels, flush=True)
    r.mul_mat(wq, xh, out=y)
    F.linear(xh, w16)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
