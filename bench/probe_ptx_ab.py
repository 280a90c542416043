"""Probe: same-run A/B of emitted MMQ builds against another emission of the same kernels (their PTX and manifest in
OLD_DIR/<arch>/, e.g. from `git show REV:emitted/sm_90a/NAME.ptx`, as the device machine has no git history).
Whole op through mmq_launch on the kernel's own path: register-A builds "wgmma_ra_x16" after convert_f16_perm ("_cx"
ones convert x themselves), mmq_q4_k_wgmma_n* "wgmma", mmq_q4_k_f16_n* the sm_89 PTX's "mma.sync" / "mma.sync_x16";
weights rotated past the L2, bench_gemv's timing; the relative difference of the two results is printed (within the
1e-3 bar of each other). Usage: probe_ptx_ab.py OLD_DIR KERNEL,... MxK,... T,... [reps]."""
import json
import pathlib

import numpy as np
import torch

import ptxgen.runtime as r
from bench_gemv import probe_argv, probe_cases, ptx_function, timed, zeroed_flag
from ptxgen.runtime import kernels, ops

old_dir, names, shapes, tokens, reps = probe_argv(30, lead=2)
old_dir, names = pathlib.Path(old_dir), names.split(",")
flag = zeroed_flag(r)


def path_of(name):
    """(mmq_launch path, PTX target) of an MMQ build."""
    if name.startswith("mmq_q4_k_f16_"):
        return ("mma.sync_x16" if name.endswith("_x16") else "mma.sync"), "sm_89"
    if name.startswith("mmq_q4_k_wgmma_ra_"):
        return ("wgmma_ra_cx" if name.endswith("_cx") else "wgmma_ra_x16"), "sm_90a"
    return "wgmma", "sm_90a"


def old_build(name):
    """Compiled as kernels.load compiles the emitted build (bench_gemv.ptx_function)."""
    arch = path_of(name)[1]
    entry = next(e for e in json.loads((old_dir / arch / "manifest.json").read_text())["kernels"] if e["kernel"] == name)
    return ptx_function(r, (old_dir / arch / f"{name}.ptx").read_text(), entry, arch)


print("| kernel | M×K | T | new µs | old µs | old / new | relative difference |")
print("|---|---|---|---|---|---|---|")
builds = {n: (kernels.load(n, path_of(n)[1]), old_build(n)) for n in names}
for m, k, raw, ws, t, x, y in probe_cases(r, torch, "q4_K", shapes, tokens):
    xa, ya = r.as_device_array(x), r.as_device_array(y)
    for name, (new, old) in builds.items():
        bn = int(name.split("_n")[1].split("_")[0])
        path, arch = path_of(name)
        us, got = [], []
        for fn in (new, old):
            kernels._BEST[(name, arch, "emitted")] = fn
            y.fill_(float("nan"))
            ops.mmq_launch(ws[0], xa, ya, t, flag, arch=arch, bn=bn, path=path)
            got.append(y.cpu().numpy().astype(np.float64))
            us.append(timed(lambda i: ops.mmq_launch(ws[i % len(ws)], xa, ya, t, flag, arch=arch, bn=bn, path=path),
                            reps, torch))
        kernels._BEST[(name, arch, "emitted")] = new
        assert np.isfinite(got[0]).all() and np.isfinite(got[1]).all(), (name, m, k, t)
        diff = float(np.linalg.norm(got[0] - got[1]) / np.linalg.norm(got[1]))
        assert diff < 1e-3, (name, m, k, t, diff)
        print(f"| {name} | {m}×{k} | {t} | {us[0]:.1f} | {us[1]:.1f} | {us[1] / us[0]:.3f} | {diff:.1e} |", flush=True)
