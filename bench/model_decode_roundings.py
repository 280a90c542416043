"""Model (CPU, NumPy): the GEMM error of the fp16 register-A Q4_K decode's rounding forms against float64, on ggml's
quantizer (bench/results/study_min_term_mma_2026-12-07.md). Max |y - ref| / max |ref| over 16 tokens x 256 rows,
K = 4096, fp16 x:
  floor   fp16 of ggml's fp32 weight d·sc·q - dmin·m (one rounding of the whole weight)
  pair3   the shipped codecs.q4_k.dequant_pair3: q·sc' exact, fma(qs, d, -m_hi) rounded, + (-m_lo) rounded
  pair2   the same without + (-m_lo): one instruction fewer a pair, rejected on 2026-11-30 for the outlier case
  pair2c  pair2, with the m_lo term applied to y as a min-term MMA on the fp16 x's sub-block sums (fp32 products)

  python3 bench/model_decode_roundings.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from ptxgen import formats  # noqa: E402
from ptxgen.formats import ggml  # noqa: E402

F16, F32, F64 = np.float16, np.float32, np.float64

def fields(raw):
    b = raw.reshape(-1, 144)
    d = ggml._half(b, 0).astype(F32); dmin = ggml._half(b, 2).astype(F32)
    sc, m = ggml.unpack_scale_min_k4(b[:, 4:16])
    q = ggml._nibbles_k(b[:, 16:144])
    return d, dmin, sc.astype(F32), m.astype(F32), q.astype(F32)

def weights(raw, mrows, k):
    d, dmin, sc, m, q = fields(raw)
    qs = np.repeat(sc, 32, 1) * q                                  # exact (fp16 integer)
    M = (dmin[:, None] * m).astype(F32)                           # exact in fp32
    m_hi = M.astype(F16); m_lo = (M - m_hi.astype(F32)).astype(F16)
    dd = d.astype(F16).astype(F64)[:, None]
    t = (qs.astype(F64) * dd - np.repeat(m_hi.astype(F64), 32, 1)).astype(F16)   # one fma, one rounding
    pair3 = (t.astype(F64) - np.repeat(m_lo.astype(F64), 32, 1)).astype(F16)
    exact = ggml.dequantize_q4_k(raw.reshape(-1, 144)).astype(F64)
    shp = (mrows, k)
    return (exact.reshape(shp), exact.astype(F16).reshape(shp), pair3.reshape(shp), t.reshape(shp),
            m_lo.astype(F64).reshape(mrows, k // 32))

def run(w, x, label):
    mrows, k = w.shape
    raw = formats.quantize("q4_K", w.astype(F32))
    exact, floor, pair3, pair2, m_lo = weights(raw, mrows, k)
    x16 = x.astype(F16).astype(F64)
    ref = x.astype(F64) @ exact.T
    xs = x16.reshape(x.shape[0], k // 32, 32).sum(-1)                 # fp32 sums of the fp16 x (as hi + lo: ~exact)
    outs = {"floor": x16 @ floor.astype(F64).T, "pair3": x16 @ pair3.astype(F64).T,
            "pair2": x16 @ pair2.astype(F64).T, "pair2c": x16 @ pair2.astype(F64).T - xs @ m_lo.T}
    scale = np.abs(ref).max()
    print(label, "  ".join(f"{n} {np.abs(o - ref).max() / scale:.2e}" for n, o in outs.items()))


def main():
    rng = np.random.default_rng(0)
    for trial in range(3):
        w = rng.standard_normal((256, 4096)) * 0.02
        x = rng.standard_normal((16, 4096))
        run(w, x, f"gaussian {trial}")
    for trial in range(3):
        w = rng.standard_normal((256, 4096)) * 0.01
        w[:, ::32] = -0.5          # one outlier a sub-block
        x = rng.standard_normal((16, 4096))
        run(w, x, f"outlier  {trial}")
    for trial in range(2):
        w = np.abs(rng.standard_normal((256, 4096))) * 0.02 + 0.05   # all-positive: the min term large against the weights
        x = rng.standard_normal((16, 4096))
        run(w, x, f"offset   {trial}")


if __name__ == "__main__":
    main()
