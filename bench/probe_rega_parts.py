"""Probe: what the register-A MMQ's dequant costs at large T (mmq_q4_k_wgmma_ra_n<bn>, fp16 x from convert_f16_perm).
The GEMM kernel's device time (CUPTI), same run, for builds made in-process with parts of the dequant replaced
(wrong results: timing only; the error against the real build is printed to show each variant ran):
real = the emitted build (q4k_dequant_pair3: 3 instructions per f16x2); 2 ops = without the −m_lo add (its error
model reached 1.6e-3 on outlier sub-blocks: bench/NOTES.md session 20); no scales = constant scales (no header load,
no 6-bit decode; the shfl of constants stay); const A = A fragments are one register (no qs loads, nibble ops,
scales or fmas: the ring, the wgmmas and the sync alone). cuBLAS fp16 on the same shape (torch.matmul, fp16 W and x)
for scale. --clocks: nvidia-smi's SM clock and power while each build runs back to back for ~2 s on the first case
(is the kernel held by the power limit?). Session 20's logs with the columns "consumer scales", "3 ops", "one fma"
came from this probe at 1baaab0 (the 4-instruction pairs and the since-removed scale table).
Usage: probe_rega_parts.py MxK,... T,... [bn] [--clocks]."""
import subprocess
import sys
import time

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import kernel_times, probe_cases, ptx_function, zeroed_flag
from ptxgen.arch import get_arch
from ptxgen.ir import Imm
from ptxgen.kernels import mmq
from ptxgen.runtime import kernels, ops

clocks = "--clocks" in sys.argv
argv = [a for a in sys.argv if a != "--clocks"]
shapes = [tuple(int(v) for v in s.split("x")) for s in argv[1].split(",")]
tokens = [int(v) for v in argv[2].split(",")]
bn = int(argv[3]) if len(argv) > 3 else 256
reps = 20
name = f"mmq_q4_k_wgmma_ra_n{bn}"
real_scales, real_pair = mmq.q4k_scale_ints, mmq.q4k_dequant_pair3


def const_scales(b, hdr, sub, dscale):  # (sc', −m_hi, −m_lo, d) = (1, 0, 0, 1)
    return tuple(b.op("mov.b32", Imm(v, "b32")) for v in (0x3C003C00, 0x00000000, 0x00000000, 0x3C003C00))


def two_ops(b, h, scale):
    sc, c, d, nm_hi, _ = scale
    return b.op("fma.rn.f16x2", b.op("fma.rn.f16x2", h, sc, c, type="b32"), d, nm_hi, type="b32")


def variant(scales, pair):
    mmq.q4k_scale_ints, mmq.q4k_dequant_pair3 = scales, pair
    try:
        k = mmq.build(get_arch("sm_90a"), mmq.MmqSpec(bn, "wgmma", a_regs=True))
    finally:
        mmq.q4k_scale_ints, mmq.q4k_dequant_pair3 = real_scales, real_pair
    text = k.ptx()
    entry = k.manifest(text)
    return ptx_function(r, text, entry, "sm_90a")


real = kernels.load(name, "sm_90a")
builds = {"real": real, "2 ops": variant(real_scales, two_ops), "no scales": variant(const_scales, real_pair),
          "const A": variant(const_scales, lambda b, h, scale: h)}
flag = zeroed_flag(r)


def gemm_us(launch, every=False):
    per = kernel_times(torch, launch, reps, skip=("sleep", "spin"))
    return sum(v for n_, v in per.items() if every or "mmq" in n_)


cols = list(builds)
print(f"| M×K | T | {' | '.join(c + ' µs (err)' for c in cols)} | cuBLAS fp16 µs | real / const A |")
print("|---|---|" + "---|" * (len(cols) + 2))
for m, k, raw, ws, t, x, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    cells, ref = {}, None
    for c, fn in builds.items():
        kernels._BEST[(name, "sm_90a", "emitted")] = fn
        y.fill_(float("nan"))
        ops.mmq_launch(ws[0], xa, ya, t, flag, bn=bn, path="wgmma_ra_x16")
        got = y.cpu().numpy().astype(np.float64)
        ref = got if ref is None else ref
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        cells[c] = (gemm_us(lambda i: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, bn=bn, path="wgmma_ra_x16")),
                    err)
    kernels._BEST[(name, "sm_90a", "emitted")] = real
    flag.owner.fill_bytes(0)
    wf = torch.randn(m, k, device="cuda", dtype=torch.float16)
    xf = x.half()
    cub = gemm_us(lambda i: torch.matmul(xf, wf.T), every=True)
    print(f"| {m}×{k} | {t} | {' | '.join(f'{us:.1f} ({e:.0e})' for us, e in cells.values())} | {cub:.1f} | "
          f"{cells['real'][0] / cells['const A'][0]:.3f} |", flush=True)

if clocks:  # the first case again, each build back to back while nvidia-smi samples the SM clock and power
    (m, k, raw, ws, t, x, y), = probe_cases(r, torch, "q4_K", shapes[:1], tokens[:1])
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    print(f"\n{m}×{k} T={t}, back to back: median SM MHz, median W, µs per launch")
    for c, fn in builds.items():
        kernels._BEST[(name, "sm_90a", "emitted")] = fn
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                "-lms", "50"], stdout=subprocess.PIPE, text=True)
        torch.cuda.synchronize()
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < 2.0:
            for _ in range(20):
                ops.mmq_launch(ws[n % len(ws)], xa, ya, t, flag, bn=bn, path="wgmma_ra_x16")
                n += 1
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        smi.terminate()
        rows = [tuple(float(v) for v in ln.split(",")) for ln in smi.communicate()[0].splitlines()[4:-2] if ln.strip()]
        mhz, watts = (float(np.median([row[i] for row in rows])) if rows else float("nan") for i in (0, 1))
        print(f"{c}: {mhz:.0f} MHz, {watts:.0f} W, {dt / n * 1e6:.1f} µs (op, with convert_f16_perm)", flush=True)
    kernels._BEST[(name, "sm_90a", "emitted")] = real
