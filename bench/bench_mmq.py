"""Prefill GEMM benchmark (needs a GPU and torch): ptxgen's Q4_K MMQ (both lowerings: wgmma + TMA on sm_90,
fp16 mma.sync) against cuBLAS
fp16 on already-dequantized weights, dequant (ptxgen kernel) + cuBLAS, tinygemm, and llama.cpp's MMQ
figures from shared/PERF.md (a fixed column, measured with test-backend-ops on the same H200 model).

Timing as in bench_gemv: CUDA events behind a long torch.cuda._sleep (device time only), weights rotated
through copies that exceed 4× the 60 MB L2, median of --reps. ptxgen's figure is the whole device work of
the op: fp32 activations in (converted inside the GEMM's load pipeline on the mma.sync path, by the
convert_f16 kernel before the GEMM on the wgmma path, both counted), fp32 out; the op's 4-byte overflow
flag readback is host work and not included. "ptxgen µs" is the path mul_mat picks.
"""
import argparse
import json
import math

import numpy as np

from ptxgen import knobs

from bench_gemv import HBM, HBM_NOTE, need_torch, pyplot, random_raw, timed, tinygemm_us as tinygemm, weight_copies

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]
TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
PEAK_FP16 = 989e12
LLAMA = {  # shared/PERF.md, µs, q4_K MUL_MAT (includes its Q8_1 quantize kernel)
    (4096, 14336): {16: 37.4, 64: 70.5, 256: 227.0, 512: 359.9, 1024: 698.7, 4096: 2714.2},
    (14336, 4096): {16: 35.5, 128: 110.6, 512: 384.2, 4096: 2640.0},
    (4096, 4096): {16: 18.5, 512: 105.3, 4096: 805.0},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tokens", default=None, help="comma-separated subset of T (default: all)")
    ap.add_argument("--cluster", action="store_true",
                    help="also time the register-A MMQ in clusters of 2 (not dispatched; a protocol error there can "
                         "hang the GPU rather than fail, so run test_wgmma_cluster_multicast_mmq first)")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                    help="force a kernel choice, e.g. PTXGEN_MMQ_CX=0 (ptxgen/knobs.py LOWERING; repeatable)")
    args = ap.parse_args()
    knobs.set(**knobs.parse(args.knob))
    tokens = TOKENS if args.tokens is None else [int(v) for v in args.tokens.split(",")]
    torch = need_torch()

    import ptxgen.runtime as r
    from ptxgen import formats

    rng = np.random.default_rng(0)
    results = []
    print(HBM_NOTE)
    print("| M×K | T | ptxgen µs | TFLOP/s | % fp16 peak | floor µs | cuBLAS fp16 µs | dequant+cuBLAS µs | tinygemm µs "
          "| llama.cpp µs (PERF.md) | vs llama.cpp | vs cuBLAS | vs dequant+cuBLAS | mma.sync µs (x converted in the GEMM) "
          "| mma.sync x16 µs (convert_f16, then the GEMM on fp16 x) | wgmma µs "
          "| wgmma tile n32/n64/n128/n256 µs | Q8_1 fused µs | quantize_q8_1_mmq + Q8_1 GEMM µs | fast-mode µs "
          "| fast vs llama.cpp | tensor-core skinny µs (T ≤ 16, fp16 x: gemv_q4_k_mma_t16h, the default there) "
          "| skinny vs llama.cpp | skinny, sm_89 build µs | exact 16-token GEMV µs (gemv_q4_k_mma_n16) "
          "| register-A skinny GEMM µs (mmq_q4_k_rega_n32, T = 17-64; its sm_89 build) | wgmma, A from registers, per token tile µs (the default from T = 33: n64 to 64, n128 to 128, n256 above) "
          "| the same in clusters of 2, activation multicast, per token tile µs (T ≥ 64 with --cluster; not dispatched) "
          "| mma.sync path µs (mul_mat(arch='sm_89'): the sm_89 PTX) | its vs llama.cpp | its vs dequant+cuBLAS |")
    print("|---" * 31 + "|")
    for (m, k) in SHAPES:
        raw = random_raw("q4_K", m, k, rng)
        wbytes = raw.nbytes
        ws = weight_copies(r, "q4_K", raw, m, k)
        copies = len(ws)
        w16 = torch.from_numpy(formats.dequantize("q4_K", raw, (m, k)).astype(np.float16)).cuda()
        w16s = [w16.clone() for _ in range(max(2, math.ceil(4 * 60e6 / w16.numel() / 2)))]
        deq_out = r.DeviceArray.empty((m, k), np.float16)
        deq_t = torch.as_tensor(deq_out, device="cuda")
        flag = r.DeviceArray.empty((1,), np.uint32)
        for t in tokens:
            x = torch.randn(t, k, device="cuda", dtype=torch.float32)
            y = torch.empty(t, m, device="cuda", dtype=torch.float32)
            from ptxgen.runtime.ops import mma_sync_x16, mmq_launch, mmq_path, q8_path

            # correctness of this very shape before timing it
            got = r.mul_mat(ws[0], x[:, :].cpu().numpy())
            ref = formats.gemm_ref("q4_K", raw, m, k, x.cpu().numpy()) if m * t <= 4096 * 512 else None
            err = None if ref is None else float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            xa, ya = r.as_device_array(x), r.as_device_array(y)
            us_mmq = timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag), args.reps, torch)
            us_sync = timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag, path="mma.sync"), args.reps, torch)
            us_x16 = timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag, path="mma.sync_x16"), args.reps, torch)
            # what mul_mat(arch="sm_89") runs past the skinny GEMMs: x converted inside the GEMM, or convert_f16 first
            us_sync_auto = us_x16 if mma_sync_x16(m, k, t, "sm_89") else us_sync
            has_wg = r.current().sm == 90
            us_wg = timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag, path="wgmma"), args.reps, torch) \
                if has_wg else None
            by_tile = {bn: timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag, bn=bn, path="wgmma"),
                                 args.reps // 2, torch) for bn in (32, 64, 128, 256)} if has_wg else {}
            us_q8 = timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag, path="q8"), args.reps, torch)
            us_q8p = timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag, path="q8_pre"), args.reps, torch)
            q8 = q8_path(t, mmq_path())
            us_fast = {"q8": us_q8, "q8_pre": us_q8p, None: us_mmq}[q8]  # what mul_mat(mode="fast") runs
            xh = x.half()
            cub = timed(lambda i: torch.matmul(xh, w16s[i % len(w16s)].t()), args.reps, torch)
            deqc = timed(lambda i: (r.dequantize(ws[i % copies], out=deq_out), torch.matmul(xh, deq_t.t())), args.reps, torch)
            tiny = tinygemm(torch, m, k, t, args.reps)
            skinny = skinny_us(r, ws, copies, raw, x, y, m, k, t, args.reps, torch)
            skinny89 = skinny_us(r, ws, copies, raw, x, y, m, k, t, args.reps, torch, arch="sm_89")  # its sm_89 plan
            n16 = skinny_us(r, ws, copies, raw, x, y, m, k, t, args.reps, torch, exact=True)
            rega = {a: rega_skinny_us(ws, copies, raw, xa, ya, m, k, t, args.reps, torch, a) for a in (None, "sm_89")}
            us_ra = rega_us(ws, copies, raw, x, xa, ya, y, m, k, t, flag, args.reps, torch) if has_wg else None
            us_mc = None
            if args.cluster and has_wg and t >= 64:  # not dispatched yet: an error is reported in its cell, not fatal
                try:
                    us_mc = rega_us(ws, copies, raw, x, xa, ya, y, m, k, t, flag, args.reps, torch, path="wgmma_ra_mc")
                except Exception as e:
                    us_mc = {"error": f"{type(e).__name__}: {str(e)[:60]}"}
            # what mul_mat runs (timed apart from mul_mat itself: the MMQ's overflow-flag readback is a host sync)
            from ptxgen.runtime.ops import skinny_ok

            us = (skinny if skinny is not None and knobs.q4k_t16h() != "off" else
                  n16 if n16 is not None and knobs.q4k_mma() != "off" else
                  rega[None] if rega[None] is not None and skinny_ok("q4_K", t, m, k) else us_mmq)
            # the mma.sync targets' path (mul_mat(arch="sm_89"), the sm_89 PTX on this GPU): 9-16 tokens the t16h
            # skinny GEMM's sm_89 build, 17-64 the register-A skinny GEMM's, the fp16 mma.sync MMQ above
            us89 = (skinny89 if skinny89 is not None and knobs.q4k_t16h() != "off" else
                    rega["sm_89"] if rega["sm_89"] is not None and skinny_ok("q4_K", t, m, k, "sm_89") else us_sync_auto)
            flops = 2 * m * k * t
            floor = max(wbytes / HBM, flops / PEAK_FP16) * 1e6
            ll = LLAMA.get((m, k), {}).get(t)
            row = {"m": m, "k": k, "T": t, "us": us, "tflops": flops / us / 1e6, "pct_peak": 100 * flops / us / 1e6 / (PEAK_FP16 / 1e12),
                   "floor_us": floor, "us_cublas_fp16": cub, "us_dequant_cublas": deqc, "us_tinygemm": tiny,
                   "us_llamacpp": ll, "rel_err": err, "us_mma_sync": us_sync, "us_wgmma": us_wg,
                   "us_wgmma_by_token_tile": by_tile, "us_q8_fused": us_q8, "us_q8_separate": us_q8p,
                   "us_fast_mode": us_fast, "us_tc_skinny": skinny, "us_mmq": us_mmq,
                   "us_tc_skinny_sm89": skinny89, "us_exact_n16": n16, "us_rega_skinny": rega[None],
                   "us_rega_skinny_sm89": rega["sm_89"], "us_wgmma_rega": us_ra, "us_wgmma_rega_cluster2": us_mc,
                   "us_mma_sync_path": us89, "us_mma_sync_x16": us_x16}
            results.append(row)
            f = lambda v: "n/a" if v is None else f"{v:.1f}"  # noqa: E731
            print(f"| {m}×{k} | {t} | {us:.1f} | {row['tflops']:.0f} | {row['pct_peak']:.0f}% | {floor:.1f} | {cub:.1f} | "
                  f"{deqc:.1f} | {f(tiny)} | {f(ll)} | {'n/a' if ll is None else f'{ll / us:.2f}x'} | {cub / us:.2f}x | "
                  f"{deqc / us:.2f}x | {us_sync:.1f} | {us_x16:.1f} | {f(us_wg)} | {' / '.join(f'{v:.0f}' for v in by_tile.values())} | "
                  f"{us_q8:.1f} | {us_q8p:.1f} | {us_fast:.1f} | {'n/a' if ll is None else f'{ll / us_fast:.2f}x'} | "
                  f"{f(skinny)} | {'n/a' if ll is None or skinny is None else f'{ll / skinny:.2f}x'} | {f(skinny89)} | {f(n16)} | "
                  f"{f(rega[None])} / {f(rega['sm_89'])} | "
                  f"{tiles_cell(us_ra)} | {tiles_cell(us_mc)} | {us89:.1f} | "
                  f"{'n/a' if ll is None else f'{ll / us89:.2f}x'} | {deqc / us89:.2f}x |", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
        plot(results, args.out.replace(".json", ".png"))


def skinny_us(r, ws, copies, raw, x, y, m, k, t, reps, torch, arch=None, exact=False):
    """The tensor-core skinny Q4_K GEMMs at 9-16 tokens, whole op (prep launch + GEMV), checked against the float64
    reference first: gemv_q4_k_mma_t16h (fp16 x, mul_mat's default there; 1e-3) or, exact, gemv_q4_k_mma_n16 (two
    prep launches; 1e-5). None where it does not run."""
    from ptxgen import formats, knobs
    from ptxgen.runtime import ops

    name = "gemv_q4_k_mma_n16" if exact else "gemv_q4_k_mma_t16h"
    if not 9 <= t <= 16 or ops.kernels.build_for(name, arch) is None:
        return None
    env = {"PTXGEN_Q4K_T16H": "0", "PTXGEN_Q4K_MMA": "1"} if exact else {"PTXGEN_Q4K_T16H": "1"}
    with knobs.override(**env):
        xs = x.cpu().numpy()
        ref = formats.gemm_ref("q4_K", raw, m, k, xs)
        err = np.linalg.norm(r.mul_mat(ws[0], xs, arch=arch) - ref) / np.linalg.norm(ref)
        if err > (1e-5 if exact else 1e-3):
            raise AssertionError(f"{name} {m}x{k} T={t}: relative error {err:.2e}")
        return timed(lambda i: r.mul_mat(ws[i % copies], x, out=y, arch=arch), reps, torch)


def rega_skinny_us(ws, copies, raw, xa, ya, m, k, t, reps, torch, arch=None):
    """mmq_q4_k_rega_n32 (prep_q4k_t32h per 32 tokens + the GEMM) for 17-64 tokens, checked against the float64
    reference first (1e-3, where the reference is cheap); None elsewhere."""
    from ptxgen import formats
    from ptxgen.runtime import ops

    if not 16 < t <= 64 or ops.kernels.build_for(f"mmq_q4_k_rega_n{ops.T4.Q4K_SKINNY_COLUMNS}", arch) is None:
        return None
    plans = [ops.recorded_plan(w, t, lambda pb, w=w: ops._skinny_gemm(pb, w, pb.x.ptr, pb.y.ptr, m, k, t, arch))
             for w in ws]
    if m * t <= 4096 * 64:
        ops.run_plan(plans[0], xa.ptr, ya.ptr)
        got = ya.numpy()
        ref = formats.gemm_ref("q4_K", raw, m, k, xa.numpy())
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        if err > 1e-3:
            raise AssertionError(f"mmq_q4_k_rega_n32 {m}x{k} T={t}: relative error {err:.2e}")
    return timed(lambda i: ops.run_plan(plans[i % copies], xa.ptr, ya.ptr, torch.cuda.current_stream().cuda_stream),
                 reps, torch)


def tiles_cell(us):
    """A per-token-tile cell: 'n128 45.0 / n256 44.1', the error of a build that failed, or n/a."""
    if not us:
        return "n/a"
    if "error" in us:
        return us["error"]
    return " / ".join(f"n{n} {v:.1f}" for n, v in us.items())


def rega_us(ws, copies, raw, x, xa, ya, y, m, k, t, flag, reps, torch, path="wgmma_ra"):
    """The register-A wgmma MMQ (mmq_launch `path`: "wgmma_ra", or "wgmma_ra_mc" in clusters of 2) per token tile
    that holds T (each from the smallest that holds T up), each checked against the float64 reference (1e-3)
    where that is cheap (M·T ≤ 4096·512) and for finite outputs everywhere, then timed like the other MMQ
    columns: {tile: µs}."""
    from ptxgen import formats
    from ptxgen.kernels.mmq import WGMMA_MC_TOKEN_TILES
    from ptxgen.runtime.ops import WGMMA_RA_TILES, mmq_launch

    tiles = WGMMA_MC_TOKEN_TILES if path == "wgmma_ra_mc" else WGMMA_RA_TILES
    ref = formats.gemm_ref("q4_K", raw, m, k, x.cpu().numpy()) if m * t <= 4096 * 512 else None
    out = {}
    for bn in [n for n in tiles if n >= min(t, tiles[-1])]:
        y.fill_(float("nan"))  # poison: unwritten outputs fail
        mmq_launch(ws[0], xa, ya, t, flag, bn=bn, path=path)
        got = y.cpu().numpy()
        if not np.isfinite(got).all():
            raise AssertionError(f"{path} n{bn} {m}x{k} T={t}: non-finite outputs")
        if ref is not None and np.linalg.norm(got - ref) > 1e-3 * np.linalg.norm(ref):
            raise AssertionError(f"{path} n{bn} {m}x{k} T={t}: relative error "
                                 f"{np.linalg.norm(got - ref) / np.linalg.norm(ref):.2e}")
        out[bn] = timed(lambda i: mmq_launch(ws[i % copies], xa, ya, t, flag, bn=bn, path=path), reps, torch)
    return out


def plot(results, path):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (m, k) in zip(axes, SHAPES):
        rows = [r_ for r_ in results if (r_["m"], r_["k"]) == (m, k)]
        T = [r_["T"] for r_ in rows]
        fl = lambda us, r_: 2 * m * k * r_["T"] / us / 1e6  # noqa: E731
        ax.plot(T, [fl(r_["us_mma_sync_path"], r_) for r_ in rows], "o-",
                label="ptxgen mma.sync path (mul_mat(arch='sm_89'), sm_89 PTX)")
        if rows and rows[0].get("us_wgmma"):
            ax.plot(T, [fl(r_["us"], r_) for r_ in rows], "D-", label="ptxgen mul_mat on sm_90 (wgmma MMQ above 32 T)")
        ax.plot(T, [fl(r_["us_q8_fused"], r_) for r_ in rows], "v-", label="ptxgen MMQ, int8 x Q8_1 (fused quantize)")
        ax.plot(T, [fl(r_["us_cublas_fp16"], r_) for r_ in rows], "s--", label="cuBLAS fp16 (dequantized W)")
        ax.plot(T, [fl(r_["us_dequant_cublas"], r_) for r_ in rows], "^--", label="dequant + cuBLAS")
        lt = [(r_["T"], fl(r_["us_llamacpp"], r_)) for r_ in rows if r_["us_llamacpp"]]
        if lt:
            ax.plot(*zip(*lt), "x:", label="llama.cpp MMQ (PERF.md)")
        roof = [min(PEAK_FP16, 2 * m * k * t / (m * k * 4.5 / 8 / HBM)) / 1e12 for t in T]
        ax.plot(T, roof, "k-", lw=0.8, label="roofline (Q4_K bytes, fp16 peak)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"M={m}, K={k}")
        ax.set_xlabel("tokens T")
        ax.set_ylabel("TFLOP/s")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
