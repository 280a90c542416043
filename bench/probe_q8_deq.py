"""Probe (#34's Q8_0 T = 4096 cell, 2026-12-07): what a plain fp16 GEMM on dequantized weights costs beside mul_mat —
dequantize_q8_0 / _q4_k alone, cuBLAS F.linear on the fp16 weights, the two together, and mul_mat on fp16 and fp32 x,
in 200-call loops on 4096x14336 at T = 4096 (µs a call). Needs a GPU and torch."""
import numpy as np, torch, torch.nn.functional as F
import ptxgen.runtime as r
from ptxgen.testing.strategies import random_raw
m, k, t = 4096, 14336, 4096
rng = np.random.default_rng(0)
wq = [r.QuantTensor.from_raw("q8_0", random_raw("q8_0", m, k, rng), (m, k)).to_device() for _ in range(2)]
xh = torch.randn(t, k, device="cuda").half(); x = xh.float()
y = torch.empty(t, m, device="cuda")
def timeit(fn, n=200):
    for i in range(3): fn(i)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for i in range(n): fn(i)
    e.record(); e.synchronize()
    return s.elapsed_time(e) * 1e3 / n
w16 = [r.dequantize(w) for w in wq]
print("dequantize kernels", type(w16[0]))
w16t = [torch.as_tensor(w, device="cuda") if not isinstance(w, torch.Tensor) else w for w in w16]
print("dequantize q8_0 -> fp16 us", timeit(lambda i: r.dequantize(wq[i % 2], out=w16t[i % 2])))
print("cuBLAS F.linear on dequantized us", timeit(lambda i: F.linear(xh, w16t[i % 2])))
print("deq (into torch) + cuBLAS us", timeit(lambda i: (r.dequantize(wq[i % 2], out=w16t[i % 2]), F.linear(xh, w16t[i % 2]))))
print("mul_mat fp16 x us", timeit(lambda i: r.mul_mat(wq[i % 2], xh, out=y)))
print("mul_mat fp32 x us", timeit(lambda i: r.mul_mat(wq[i % 2], x, out=y)))
print(r.mul_mat_plan(wq[0], t).kernels)
xb = torch.empty_like(xh)
print("x.half() + deq + cuBLAS us (fp32 x)", timeit(lambda i: (xb.copy_(x), r.dequantize(wq[i % 2], out=w16t[i % 2]),
                                                          F.linear(xb, w16t[i % 2]))))
w4 = [r.QuantTensor.from_raw("q4_K", random_raw("q4_K", m, k, rng), (m, k)).to_device() for _ in range(2)]
print("q4_K dequantize us", timeit(lambda i: r.dequantize(w4[i % 2], out=w16t[i % 2])))
print("q4_K deq + cuBLAS us", timeit(lambda i: (r.dequantize(w4[i % 2], out=w16t[i % 2]), F.linear(xh, w16t[i % 2]))))
print("q4_K mul_mat fp16 x us", timeit(lambda i: r.mul_mat(w4[i % 2], xh, out=y)))
print("q4_K mul_mat fp32 x us", timeit(lambda i: r.mul_mat(w4[i % 2], x, out=y)))
