"""Probe: a build-time parameter of the DSL against the shipped kernels, in one process. Each variant sets module
attributes of ptxgen's kernel builders (e.g. `mmq.RA_MAX_STAGES=12`), rebuilds the kernels whose names match
--kernels (emitted, or not shipped) from the DSL and swaps them in for the emitted ones; the op (mul_mat, or
mul_mat_id with --moe) is timed eager and graph-replayed over --weights distinct weights, and y compared bit for bit
with the shipped build's. The first column is always the shipped emitted/ builds.

  python3 bench/probe_build_ab.py --kernels 'mmq_q8_0_wgmma_ra_n64$' --formats q8_0 --tokens 16,64 \\
      --variant 'deep12: mmq.RA_MAX_STAGES=12' --variant 'deep6: mmq.RA_MAX_STAGES=6'
  python3 bench/probe_build_ab.py --kernels '_moe$' --moe 128:8 --shape 768x2048 --tokens 32,512 \\
      --variant 'deep: mmq.RA_DEEP_FORMATS=("q4_K",); mmq.RA_DEEP_MAX_BN=128; mmq.RA_DEEP_GROUPED=True'

A value is a Python literal; the attributes are restored after each variant. `rule.NAME=literal` overrides a
dispatch rule of ptxgen/tuning while the variant runs (e.g. 'few8: rule.q4k_few_max_tokens=8'), `knob.NAME=value` a
kernel-choice knob of ptxgen.knobs (e.g. 'one: knob.PTXGEN_Q4K_FUSED=1'); `kernels.ATTR`
sets an attribute of the package ptxgen.kernels itself, `codecs.MOD.ATTR` one of ptxgen.codecs.MOD. Replaces
probe_block_box.py (the nibble codecs' block box, 2026-12-02: no win; bench/NOTES.md)."""
import argparse
import ast
import importlib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402


def parse_variant(text: str):
    """'name: mod.ATTR=literal; mod.ATTR=literal' → (name, [(module, attr, value)])."""
    name, _, body = text.partition(":")
    sets = []
    for part in filter(None, (p.strip() for p in body.split(";"))):
        target, _, value = part.partition("=")
        mod, _, attr = target.strip().rpartition(".")
        if mod in ("rule", "knob"):  # a dispatch rule of ptxgen/tuning, or a kernel-choice knob, while it runs
            sets.append((mod, attr, ast.literal_eval(value.strip()) if mod == "rule" else value.strip()))
            continue
        module = ("ptxgen.kernels" if mod == "kernels" else f"ptxgen.{mod}" if mod.startswith("codecs.")
                  else f"ptxgen.kernels.{mod}")
        sets.append((importlib.import_module(module), attr, ast.literal_eval(value.strip())))
    return name.strip(), sets


def swap(names, sets):
    """Rebuild `names` from the DSL with `sets` applied and load them in place of the emitted builds; returns the
    attributes' old values (restore with restore())."""
    from ptxgen.runtime import kernels
    from ptxgen.runtime.compiler import compile_ptx
    from ptxgen.runtime.driver import Module

    old = [(m, a, getattr(m, a)) for m, a, _ in sets]
    for m, a, v in sets:
        setattr(m, a, v)
    kernels._built.cache_clear()  # the DSL builds are cached per (kernel, arch): each variant builds its own
    for name in names:
        text, entry = kernels.ptx_source(name, "sm_90a", "dsl")
        if entry["meta"].get("compile") == "whole-program":  # as kernels.load: the driver's JIT honours setmaxnreg
            mod = Module(text.encode() + b"\0", name)
        else:
            mod = Module(compile_ptx(text, "sm_90a", name=name).cubin, name)
        fn = mod.function(entry["entry"], entry["params"], entry["block"], entry.get("dynamic_smem", 0))
        fn.meta, fn.arch = entry["meta"], "sm_90a"
        kernels._BEST[(name, None, "emitted")] = kernels._BEST[(name, "sm_90a", "emitted")] = fn
    return old


def restore(old):
    from ptxgen.runtime import kernels

    for m, a, v in old:
        setattr(m, a, v)
    kernels._BEST.clear()
    kernels._built.cache_clear()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", required=True, help="regex over sm_90a kernel names: the builds to rebuild")
    ap.add_argument("--variant", action="append", required=True, help="'name: mod.ATTR=literal; ...'")
    ap.add_argument("--formats", default="q4_K")
    ap.add_argument("--shape", default="4096x14336", help="M x K (an expert's, with --moe)")
    ap.add_argument("--tokens", default="16,64,512")
    ap.add_argument("--moe", default=None, metavar="E:TOP", help="time mul_mat_id over E experts, TOP a token")
    ap.add_argument("--weights", type=int, default=8, help="distinct weights the loop rotates over (enough that they "
                    "exceed the 60 MB L2 for decode shapes: 32 for 1024x4096 Q4_K)")
    ap.add_argument("--x-dtype", default="float32", choices=("float32", "float16"), help="the activations' dtype")
    args = ap.parse_args()
    import torch

    import ptxgen.runtime as r
    from bench_op import eager, graphed
    from ptxgen import knobs, tuning
    from ptxgen.runtime import kernels
    from ptxgen.testing.strategies import random_raw

    variants = [parse_variant(v) for v in args.variant]
    from ptxgen.kernels import KERNELS, NOT_SHIPPED

    # the emitted builds and those not shipped (the runtime builds them on demand: rebuilt here per variant too)
    names = [n for n in kernels.manifest("sm_90a") if re.search(args.kernels, n)]
    names += [n for n in NOT_SHIPPED if re.search(args.kernels, n) and "sm_90a" in KERNELS[n].archs]
    if not names:
        raise SystemExit(f"no sm_90a kernel matches {args.kernels!r}")
    m, k = map(int, args.shape.split("x"))
    e, top = map(int, args.moe.split(":")) if args.moe else (1, 1)
    n = args.weights
    heads = " | ".join(f"{v[0]} eager / graph" for v in variants)
    print(f"{'mul_mat_id ' + str(e) + ' experts top-' + str(top) + ', ' if args.moe else ''}{m}x{k}, µs per op over "
          f"{n} weights; rebuilt: {', '.join(names)}")
    print(f"| fmt | T | shipped eager / graph | {heads} | same bits | kernels |")
    print("|---|---|---|" + "---|" * len(variants) + "---|---|")
    rng = np.random.default_rng(0)
    for fmt in args.formats.split(","):
        raw = random_raw(fmt, e * m, k, rng)
        ws = [r.QuantTensor.from_raw(fmt, raw, (e, m, k) if args.moe else (m, k)).to_device() for _ in range(n)]
        for t in map(int, args.tokens.split(",")):
            x = torch.randn(t, k, device="cuda", dtype=getattr(torch, args.x_dtype))
            if args.moe:
                ids = torch.as_tensor(np.stack([rng.choice(e, top, replace=False) for _ in range(t)]).astype(np.int32),
                                      device="cuda")
                ys = [torch.empty(t, top, m, device="cuda") for _ in range(n)]
                call = lambda i: r.mul_mat_id(ws[i % n], x, ids, out=ys[i % n])  # noqa: E731
                plan = lambda: r.mul_mat_id_plan(ws[0], t, top).kernels  # noqa: E731
            else:
                ys = [torch.empty(t, m, device="cuda") for _ in range(n)]
                call = lambda i: r.mul_mat(ws[i % n], x, out=ys[i % n])  # noqa: E731
                plan = lambda: r.mul_mat_plan(ws[0], t, x_dtype=args.x_dtype).kernels  # noqa: E731
            cells, got, kern = [], [], []
            for sets in [[]] + [v[1] for v in variants]:
                mods = [s for s in sets if s[0] not in ("rule", "knob")]
                old = swap(names, mods) if mods else []
                for w in ws:
                    w._plans.clear()
                with tuning.override(**{a: v for m_, a, v in sets if m_ == "rule"}), \
                        knobs.override(**{a: v for m_, a, v in sets if m_ == "knob"}):
                    cells.append(f"{eager(torch, call, calls=4 * n):.1f} / {graphed(torch, call, calls=4 * n):.1f}")
                    kern.append(" + ".join(plan()))  # (the variant's own plan: a knob or rule may change the builds)
                got.append(ys[0].clone())
                restore(old)
            same = all(torch.equal(got[0].view(torch.int32), g.view(torch.int32)) for g in got[1:])
            if not same:  # a variant that sums in another order: how far from the shipped build's y
                scale = got[0].abs().max().item()
                same = "max rel " + ", ".join(f"{(g - got[0]).abs().max().item() / scale:.1e}" for g in got[1:])
            others = "; ".join(f"{v[0]}: {kn}" for v, kn in zip(variants, kern[1:]) if kn != kern[0])
            print(f"| {fmt} | {t} | {' | '.join(cells)} | {same} | {kern[0]}{' (' + others + ')' if others else ''} |",
                  flush=True)
        ws = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
