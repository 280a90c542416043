"""Record how the GPU's tensor cores round: one mma.sync m16n8k16 f32 += f16 x f16 per warp on random
fragments (wide exponent spreads, so alignment and truncation show), inputs and outputs saved to an .npz
that tests/test_emu.py's tensor-core model is fitted and checked against (no GPU needed afterwards).

usage: python3 bench/probe_mma_rounding.py --out DIR
"""
import argparse
import pathlib

import numpy as np

import ptxgen.runtime as r
from ptxgen.runtime.compiler import compile_ptx
from ptxgen.runtime.driver import Module

PTX = """.version 8.7
.target sm_90
.address_size 64
.visible .entry probe(
	.param .u64 a,
	.param .u64 b,
	.param .u64 c,
	.param .u64 d
)
{
\t.reg .b32 %r<16>;
\t.reg .f32 %f<12>;
\t.reg .b64 %rd<16>;
\tmov.u32 %r0, %tid.x;
\tmov.u32 %r1, %ctaid.x;
\tmad.lo.u32 %r2, %r1, 32, %r0;
\tld.param.u64 %rd0, [a];
\tld.param.u64 %rd1, [b];
\tld.param.u64 %rd2, [c];
\tld.param.u64 %rd3, [d];
\tmul.wide.u32 %rd4, %r2, 16;
\tmul.wide.u32 %rd5, %r2, 8;
\tadd.s64 %rd6, %rd0, %rd4;
\tadd.s64 %rd7, %rd1, %rd5;
\tadd.s64 %rd8, %rd2, %rd4;
\tadd.s64 %rd9, %rd3, %rd4;
\tld.global.v4.u32 {%r4, %r5, %r6, %r7}, [%rd6];
\tld.global.v2.u32 {%r8, %r9}, [%rd7];
\tld.global.v4.f32 {%f0, %f1, %f2, %f3}, [%rd8];
\tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f4, %f5, %f6, %f7}, {%r4, %r5, %r6, %r7}, {%r8, %r9}, {%f0, %f1, %f2, %f3};
\tst.global.v4.f32 [%rd9], {%f4, %f5, %f6, %f7};
\tret;
}
"""


def draw(rng, n_mma):
    """Fragments of n_mma independent mma.sync: A [n, 32, 8] f16, B [n, 32, 4] f16, C [n, 32, 4] f32."""
    def f16(shape, spread):
        v = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))
        return np.clip(v, -6e4, 6e4).astype(np.float16)
    parts = []
    for spread_ab, spread_c in ((0, 0), (4, 8), (8, 16), (2, 30)):
        k = n_mma // 4
        a, b = f16((k, 32, 8), spread_ab), f16((k, 32, 4), spread_ab)
        c = (rng.standard_normal((k, 32, 4)) * np.exp2(rng.integers(-spread_c, spread_c + 1, (k, 32, 4)))).astype(np.float32)
        c[: k // 8] = 0  # some with a zero accumulator
        parts.append((a, b, c))
    return [np.concatenate(x) for x in zip(*parts)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(2026)
    n = 8192
    a, b, c = draw(rng, n)
    res = compile_ptx(PTX, "sm_90", name="probe")
    fn = Module(res.cubin, "probe").function("probe", [{"name": x, "type": "u64"} for x in "abcd"], (32, 1, 1))
    dev = [r.as_device_array(np.ascontiguousarray(x)) for x in (a, b, c)]
    d = r.DeviceArray.empty(c.shape, np.float32)
    fn.launch((n,), (*dev, d))
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out.with_suffix(".npz"), a=a, b=b, c=c, d=d.numpy())
    print(f"{n} mma.sync m16n8k16 recorded to {out.with_suffix('.npz')}")


if __name__ == "__main__":
    main()
