"""A model's linear layers as the user runs them (needs a GPU and torch): writes a GGUF with Llama-3-8B's linear
shapes in the Q4_K_M mix as llama.cpp's quantizer assigns it (Q6_K for `output` and for `attn_v` / `ffn_down` in
the layers its use_more_bits rule picks, Q4_K elsewhere; --format puts every tensor in one format, TQ4_1S with
Qwen2.5-7B's shapes; --model qwen2.5-7b takes those shapes for any format), loads it with QuantTensor.from_gguf, and times one decode step's matmuls (T = 1) and a
prefill's (T = --tokens, 512), each captured into a CUDA graph and replayed: the whole step, layer by layer (a
layer's seven matmuls in one graph; the output layer alone), and per kind of weight (all layers' q, k, ... in one
graph). Beside them cuBLAS fp16 (`F.linear` on the dequantized weights, the same
graphs; on fp32 x, for whole layers and steps, also with the x.half() such a caller pays, once an activation) and the byte floor (weight bytes / 4.27 TB/s on an H200: bench_gemv.device_hbm). Weights are random valid blocks (speed, not accuracy: the
tests check accuracy). `--dry-run` (no GPU): a small model, written, read back, and the kernels mul_mat would run
per tensor on an H200, planned without one.

    python3 bench/bench_model.py --layers 4 --out model.json
    python3 bench/bench_model.py --format q6_K --layers 2
"""
import argparse
import json
import os
import tempfile
import time

import numpy as np

from bench_gemv import HBM, HBM_NOTE, need_torch

SHAPES = {  # per layer (M, K), and the output projection
    "llama3-8b": {"attn_q": (4096, 4096), "attn_k": (1024, 4096), "attn_v": (1024, 4096), "attn_output": (4096, 4096),
                  "ffn_gate": (14336, 4096), "ffn_up": (14336, 4096), "ffn_down": (4096, 14336),
                  "output": (128256, 4096), "layers": 32},
    "qwen2.5-7b": {"attn_q": (3584, 3584), "attn_k": (512, 3584), "attn_v": (512, 3584), "attn_output": (3584, 3584),
                   "ffn_gate": (18944, 3584), "ffn_up": (18944, 3584), "ffn_down": (3584, 18944),
                   "output": (152064, 3584), "layers": 28},
}


FORMATS = ("q4_K_M", "q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s")  # --format: the Q4_K_M mix, or every tensor in one


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule (llama-quant.cpp) for the layers whose attn_v / ffn_down get more bits in the _M mixes."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m(kind: str, layer: int, n_layers: int) -> str:
    if kind == "output":
        return "q6_K"
    if kind in ("attn_v", "ffn_down") and use_more_bits(layer, n_layers):
        return "q6_K"
    return "q4_K"


def default_model(fmt: str) -> str:
    """--model's default: Qwen2.5-7B's shapes for TQ4_1S (TurboQuant's published models), Llama-3-8B's otherwise."""
    return "qwen2.5-7b" if fmt == "tq4_1s" else "llama3-8b"


def model_tensors(fmt: str, layers: int, scale: int = 1, model: str | None = None):
    """[(name, kind, fmt, (M, K))]: `layers` layers of `model`'s shapes (SHAPES; default_model(fmt) by default; rows
    divided by `scale` for dry runs) in the Q4_K_M mix (fmt "q4_K_M", the layer index taken from the full model's
    depth) or one format."""
    arch = SHAPES[model or default_model(fmt)]
    out = []
    for i in range(layers):
        for kind in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            m, k = arch[kind]
            f = q4_k_m(kind, i, arch["layers"]) if fmt == "q4_K_M" else fmt
            out.append((f"blk.{i}.{kind}.weight", kind, f, (m // scale, k)))
    m, k = arch["output"]
    out.append(("output.weight", "output", q4_k_m("output", 0, 1) if fmt == "q4_K_M" else fmt, (m // scale, k)))
    return out


FUSED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))  # --fuse: the projections of one activation


def fuse(tensors):
    """--fuse: each layer's projections of one activation (q / k / v, gate / up) that share a format as one tensor
    (QuantTensor.cat, as engines fuse qkv and gate_up; Q4_K_M's Q6_K attn_v stays apart): [(name, kind, fmt,
    shape, members)], the fused entry where its first member was."""
    out, done = [], set()
    for name, kind, f, (m, k) in tensors:
        if name in done:
            continue
        layer = name.rsplit(".", 2)[0]
        peers = next((g for g in FUSED if kind in g), ())
        same = [(n, kd, mm) for n, kd, ff, (mm, kk) in tensors
                if n.startswith(layer + ".") and kd in peers and ff == f and kk == k]
        if len(same) < 2:
            out.append((name, kind, f, (m, k), [name]))
            continue
        done.update(n for n, *_ in same)
        kinds = "+".join(kd for _, kd, _ in same)
        out.append((f"{layer}.{kinds}.weight", kinds, f, (sum(mm for *_, mm in same), k), [n for n, *_ in same]))
    return out


ACTIVATION = {"attn_q": "attn_in", "attn_k": "attn_in", "attn_v": "attn_in", "attn_output": "attn_out",
              "ffn_gate": "ffn_in", "ffn_up": "ffn_in", "ffn_down": "ffn_mid", "output": "final"}


def activations(names):
    """{name: the activation it reads}: (layer, what) — a layer's q / k / v read one activation, gate / up another
    (fused kinds read their first member's). cuBLAS on an fp32 x converts each of them once (x.half())."""
    out = {}
    for n in names:
        layer, _, kind = n.removesuffix(".weight").rpartition(".")  # ("blk.3", "attn_q"), ("", "output")
        out[n] = (layer, ACTIVATION[kind.split("+")[0]])
    return out


def groups(tensors, kinds):
    """[(label, tensor names)] timed as one graph each: the whole step, each layer ("blk.<i>"), then each kind."""
    layers = list(dict.fromkeys(n.rsplit(".", 2)[0] for n, *_ in tensors if n.startswith("blk.")))
    return ([("all", [n for n, *_ in tensors])] + [(ly, [n for n, *_ in tensors if n.startswith(ly + ".")]) for ly in layers]
            + [(kd, [n for n, k_, *_ in tensors if k_ == kd]) for kd in kinds])


def write_model(path: str, tensors, seed: int = 0) -> None:
    from ptxgen import gguf
    from ptxgen.testing.strategies import random_raw

    rng = np.random.default_rng(seed)
    gguf.write_gguf(path, {name: (gguf.TYPE_IDS[f], (m, k), random_raw(f, m, k, rng)) for name, _, f, (m, k) in tensors},
                    {"general.name": "ptxgen bench_model"})


def format_arg(name: str) -> str:
    """--format as the library spells it, whatever the case (Q5_K, q5_k: q5_K); an unknown one lists the choices."""
    spelled = {f.lower(): f for f in FORMATS}
    if name.lower() not in spelled:
        raise argparse.ArgumentTypeError(f"unknown format {name!r} (choose from {', '.join(FORMATS)})")
    return spelled[name.lower()]


def main():
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))  # the first paragraph
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--format", type=format_arg, default="q4_K_M",
                    help=f"{FORMATS[0]} (the mix), or one of {', '.join(FORMATS[1:])} (any case)")
    ap.add_argument("--model", choices=tuple(SHAPES), default=None,
                    help="whose linear shapes (default: qwen2.5-7b for tq4_1s, llama3-8b otherwise)")
    ap.add_argument("--tokens", type=int, default=512, help="the prefill's T")
    ap.add_argument("--prefill-only", action="store_true", help="time the prefill step only (no decode rows)")
    ap.add_argument("--x-dtype", default="float32", choices=("float32", "float16"),
                    help="the activations mul_mat is given (cuBLAS always gets float16)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-run", action="store_true", help="no GPU: a small model, written, read, planned")
    ap.add_argument("--fuse", action="store_true",
                    help="each layer's q / k / v and gate / up of one format as one tensor (QuantTensor.cat), cuBLAS too")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                    help="force a kernel choice, e.g. PTXGEN_MMQ_CX=0 (ptxgen/knobs.py LOWERING; repeatable)")
    ap.add_argument("--rule", action="append", default=[], metavar="NAME=JSON",
                    help='a dispatch rule of ptxgen/tuning overridden for this run, e.g. codec_mma_min_tokens=1 or '
                         'codec_mma_min_tokens=\'{"q6_K": 1, "q8_0": 1}\' (repeatable)')
    args = ap.parse_args()
    if not args.dry_run:
        need_torch()  # before the model is written (GBs, seconds): a run without torch stops at once
    from ptxgen import knobs, tuning

    knobs.set(**knobs.parse(args.knob))
    tuning.set(**{n: json.loads(v) for n, v in (a.split("=", 1) for a in args.rule)})
    scale = 16 if args.dry_run else 1
    args.model = args.model or default_model(args.format)
    tensors = model_tensors(args.format, args.layers, scale, args.model)
    with tempfile.TemporaryDirectory() as d:  # the file (GBs for a whole model) goes with the run
        load_and_run(args, tensors, os.path.join(d, "model.gguf"))


def load_and_run(args, tensors, path):
    """Write the model to `path`, read its tensors back, then plan them (--dry-run) or time them."""
    t0 = time.perf_counter()
    write_model(path, tensors)
    print(f"wrote {path}: {len(tensors)} tensors, {os.path.getsize(path) / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s",
          flush=True)
    import ptxgen.runtime as r

    ws = {name: r.QuantTensor.from_gguf(path, name) for name, *_ in tensors}
    assert all(ws[name].fmt == f and ws[name].shape == shape for name, _, f, shape in tensors)
    if getattr(args, "fuse", False):  # the file stays as written (separate tensors); the fused ones are made here
        fused = fuse(tensors)
        ws = {name: ws[mem[0]] if len(mem) == 1 else r.QuantTensor.cat([ws[n] for n in mem])
              for name, _, _, _, mem in fused}
        tensors = [(name, kind, f, shape) for name, kind, f, shape, _ in fused]
        print(f"--fuse: {sum(len(mem) > 1 for *_, mem in fused)} fused tensors, {len(tensors)} ops a step", flush=True)
    if args.dry_run:
        import pytest

        from ptxgen.runtime import ops
        from ptxgen.testing import fakegpu

        fakegpu.install(pytest.MonkeyPatch())
        for name, kind, f, (m, k) in tensors:
            for t in (1, args.tokens):
                seq = " + ".join(dict.fromkeys(ops.choose(f, "exact", None, t, m, k).kernels))
                print(f"{name:28s} {f:6s} {m}x{k} T={t}: {seq}")
        return
    run(args, tensors, ws)


def run(args, tensors, ws):
    torch = need_torch()
    import torch.nn.functional as F

    import ptxgen.runtime as r
    from bench_op import graphed

    kinds = list(dict.fromkeys(kind for _, kind, *_ in tensors))
    from ptxgen import formats

    nbytes = {name: m * formats.get(f).row_bytes(k) for name, _, f, (m, k) in tensors}
    for w in ws.values():
        w.to_device()
    from ptxgen import codecs

    def dense(w):  # cuBLAS's fp16 weights: the dequantized ones, or (TQ4_1S: no GPU dequantize, its weights live in a
        # rotated domain) fp16 values of the same shape — cuBLAS's time does not depend on them
        if w.fmt in codecs.dequantizable():
            return torch.as_tensor(r.dequantize(w), device="cuda")
        return torch.randn(w.shape, device="cuda", dtype=torch.float16) * 0.02
    w16 = {name: dense(ws[name]) for name, *_ in tensors}
    if any(ws[n].fmt not in codecs.dequantizable() for n, *_ in tensors):
        print("cuBLAS on random fp16 weights of the same shapes where a format has no GPU dequantize (tq4_1s)")
    res = {"device": torch.cuda.get_device_name(), "format": args.format, "model": args.model, "layers": args.layers,
           "fuse": bool(args.fuse), "rows": []}
    print(HBM_NOTE)
    print(f"mul_mat's x: {args.x_dtype} (cuBLAS: float16)")
    conv = args.x_dtype == "float32"  # cuBLAS's time with the x.half() an fp32-x caller pays, once an activation
    if conv:
        print("cuBLAS + x.half(): each activation the graph reads converted once (a layer's q / k / v share one, gate /"
              " up one), on whole layers and steps only")
    print("| step | weights | T | ptxgen graph µs | % HBM | floor µs | cuBLAS fp16 graph µs | cuBLAS / ptxgen | "
          + ("cuBLAS + x.half() µs | ÷ ptxgen | " if conv else "") + "kernels |")
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if conv else "") + "---|")
    for t in (args.tokens,) if args.prefill_only else (1, args.tokens):
        xs = {k: torch.randn(t, k, device="cuda") for k in {shape[1] for *_, shape in tensors}}
        ys = {name: torch.empty(t, m, device="cuda") for name, _, _, (m, _) in tensors}
        xh = {k: v.half() for k, v in xs.items()}
        for label, names in groups(tensors, kinds):
            xin = xh if args.x_dtype == "float16" else xs
            ops_ = [(ws[n], xin[ws[n].shape[1]], ys[n]) for n in names]
            ours = graphed(torch, lambda i: [r.mul_mat(w, x, out=y) for w, x, y in ops_], calls=1)  # µs per step
            peer = graphed(torch, lambda i: [F.linear(xh[ws[n].shape[1]], w16[n]) for n in names], calls=1)
            whole = label == "all" or label.startswith("blk.")
            peer_cv = None
            if conv and whole:
                act = activations(names)
                xc = {a: torch.empty(t, ws[n].shape[1], device="cuda", dtype=torch.float16) for n, a in act.items()}

                def with_half(i):
                    for a in dict.fromkeys(act.values()):  # each activation converted once, before its first reader
                        xc[a].copy_(xs[xc[a].shape[1]])
                    return [F.linear(xc[act[n]], w16[n]) for n in names]
                peer_cv = graphed(torch, with_half, calls=1)
            b = sum(nbytes[n] for n in names)
            floor = b / HBM * 1e6
            row = {"T": t, "weights": label, "ptxgen_graph_us": ours, "cublas_fp16_graph_us": peer, "bytes": b,
                   "cublas_fp16_with_half_graph_us": peer_cv, "floor_us": floor, "x_dtype": args.x_dtype,
                   "kernels": {n: r.mul_mat_plan(ws[n], t, graph=True, x_dtype=args.x_dtype).kernels for n in names[:1]}}
            res["rows"].append(row)
            plans = "" if label == "all" else "; ".join(dict.fromkeys(  # each format's launches in this kind
                f"{ws[n].fmt}: {' + '.join(r.mul_mat_plan(ws[n], t, graph=True, x_dtype=args.x_dtype).kernels)}"
                for n in names))
            print(f"| {'decode' if t == 1 else 'prefill'} | {label} ({len(names)}) | {t} | {ours:.1f} | "
                  f"{100 * b / (ours * 1e-6) / HBM:.0f}% | {floor:.1f} | {peer:.1f} | {peer / ours:.2f}× | "
                  + ((f"{peer_cv:.1f} | {peer_cv / ours:.2f}× | " if peer_cv else "— | — | ") if conv else "")
                  + f"{plans} |",
                  flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
