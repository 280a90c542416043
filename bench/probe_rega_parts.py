"""Probe: what the register-A MMQ's dequant costs at large T (mmq_q4_k_wgmma_ra_n<bn>, fp16 x from convert_f16_perm).
The GEMM kernel's device time (CUPTI), same run, for builds made in-process with parts of the dequant replaced
(wrong results: timing only; the error against the real build is printed to show each variant ran):
real = the emitted build (scales decoded by the producer warpgroup's warps 1-3: SCALE_NOTE); consumer scales = the
build before that (each consumer lane decodes one (row, sub-block) scale and shares it by shfl); one fma = w = q·d_hi − m_hi (the hi/lo scale pairs' second fma and add dropped);
no scales = constant scales (no header load, no 6-bit decode; the shfl of constants stay); const A = A fragments
are a constant register (no qs loads, nibble ops, scales or fmas: the ring, the wgmmas and the sync alone).
cuBLAS fp16 on the same shape (torch.matmul, fp16 W and x) for scale. Usage: probe_rega_parts.py MxK,... T,... [bn]."""
import sys
from collections import defaultdict

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_cases
from ptxgen.arch import get_arch
from ptxgen.ir import Imm
from ptxgen.kernels import mmq
from ptxgen.runtime import kernels, ops
from ptxgen.runtime.driver import Module

shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")]
tokens = [int(v) for v in sys.argv[2].split(",")]
bn = int(sys.argv[3]) if len(sys.argv) > 3 else 256
reps = 20
name = f"mmq_q4_k_wgmma_ra_n{bn}"
real_scales, real_pair = mmq.q4k_scale_pairs, mmq.q4k_dequant_pair


def one_fma(b, h, scale, magic):
    q = b.op("sub.rn.f16x2", h, magic, type="b32")
    return b.op("fma.rn.f16x2", q, scale[0], scale[2], type="b32")


def const_scales(b, hdr, sub, dscale):
    return tuple(b.op("mov.b32", Imm(v, "b32")) for v in (0x3C003C00, 0x00000000, 0xBC00BC00, 0x00000000))


def variant(scales, pair, table=True):
    mmq.q4k_scale_pairs, mmq.q4k_dequant_pair, mmq.SCALE_TABLE = scales, pair, table
    try:
        k = mmq.build(get_arch("sm_90a"), mmq.MmqSpec(bn, "wgmma", a_regs=True))
    finally:
        mmq.q4k_scale_pairs, mmq.q4k_dequant_pair, mmq.SCALE_TABLE = real_scales, real_pair, True
    text = k.ptx()
    entry = k.manifest(text)
    fn = Module(text.encode() + b"\0", k.name).function(entry["entry"], entry["params"], entry["block"],
                                                        entry.get("dynamic_smem", 0))
    fn.meta, fn.arch = entry["meta"], "sm_90a"
    return fn


real = kernels.load(name, "sm_90a")
builds = {"real": real, "consumer scales": variant(real_scales, real_pair, table=False), "one fma": variant(real_scales, one_fma), "no scales": variant(const_scales, real_pair),
          "const A": variant(const_scales, lambda b, h, scale, magic: magic)}
flag = r.DeviceArray.empty((1,), np.uint32)
flag.owner.fill_bytes(0)


def gemm_us(launch, every=False):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            torch.cuda._sleep(1_000_000)
            launch(i)
        torch.cuda.synchronize()
    per = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and "sleep" not in ev.name:
            per[ev.name] += ev.device_time / reps
    return sum(v for n_, v in per.items() if every or "mmq" in n_)


cols = list(builds)
print(f"| M×K | T | {' | '.join(c + ' µs (err)' for c in cols)} | cuBLAS fp16 µs | real / const A | consumer scales / real |")
print("|---|---|" + "---|" * (len(cols) + 3))
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
          f"{cells['real'][0] / cells['const A'][0]:.3f} | {cells['consumer scales'][0] / cells['real'][0]:.3f} |", flush=True)
