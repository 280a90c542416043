"""Every kernel mul_mat and mul_mat_id can dispatch, at edge shapes, once each — the program compute-sanitizer runs:

    compute-sanitizer --tool memcheck  python3 bench/sanitize.py   (also racecheck, synccheck, initcheck)
    compute-sanitizer --tool racecheck python3 bench/sanitize.py --only gemv_q4_k_mma_t1_fused   (calls running it)
    bash bench/sanitize.sh                                          (all four tools, one log: $OUT/sanitize.log)

Cases: each format and mode, T at the dispatch rule's edges (1, 2, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 129), M at
tile edges (1, 127, 128, 129, 300) and K of one or a few blocks, with the knobs that pick the paths the default
rule keeps for large matrices forced on, and the mma.sync lowering (arch="sm_89") beside the wgmma one. Each call
is checked against the float64 reference (a sanitizer run must also compute the right thing). Prints the kernels
covered and the dispatchable kernels that were not.
"""
import contextlib
import sys

import numpy as np

from ptxgen import formats, knobs
from ptxgen.testing.strategies import random_raw

TOKENS = (1, 2, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 129)
FORCED = [{}, {"PTXGEN_Q4K_T1": "1"}, {"PTXGEN_Q4K_T1": "1", "PTXGEN_Q4K_FUSED": "0"}, {"PTXGEN_Q4K_MMA": "1", "PTXGEN_Q4K_T16H": "0"}, {"PTXGEN_MMQ_SKINNY": "1"},
          {"PTXGEN_MMQ_REGA": "0", "PTXGEN_MMQ_SKINNY": "0"}, {"PTXGEN_MMQ_CX": "1"}, {"PTXGEN_MMQ_PRE": "1"},
          {"PTXGEN_MMQ_X16": "1"}, {"PTXGEN_TQ4_MMA": "1"}, {"PTXGEN_Q4K_MMA": "0", "PTXGEN_Q4K_T1": "0"},
          {"PTXGEN_Q4K_XR": "1"}, {"PTXGEN_MMQ_PRE": "1", "PTXGEN_MMQ_CX": "1"},
          {"PTXGEN_MMQ_X16": "1", "PTXGEN_MMQ_SKINNY": "0"}]
SHAPES = ((1, 256), (127, 512), (128, 256), (129, 768), (300, 1024))
WIDE = (17000, 256)  # 9-16 tokens past one round of t16h's CTAs on the H200: the 16-token register-A GEMM
BIG = (8192, 4096)  # 2^25 weights: TQ4_1S's 32-row tensor-core GEMV (3-8 tokens)
# emitted kernels mul_mat's rule never dispatches (measured slower, kept for benchmarks): not expected in the sweep
NOT_DISPATCHED = {"gemv_q4_k_mma_t8", "prep_q4k_t8", "gemv_tq4_1s_tma_t4", "gemv_tq4_1s_tma_t8", "mmq_q4_k_q8_n16_pre",
                  "mmq_q4_k_q8_n32", "mmq_q4_k_q8_n64", "mmq_q4_k_q8_n64_pre"}


def cases():
    for fmt, mode in (("q4_K", "exact"), ("q4_K", "fast"), ("tq4_1s", "exact"), ("tq4_1s", "fast"), ("q8_0", "fast"),
                      ("q8_0", "exact"), ("q5_K", "exact"), ("q6_K", "exact")):
        extra = (WIDE,) if (fmt, mode) == ("q4_K", "exact") else (BIG,) if (fmt, mode) == ("tq4_1s", "exact") else ()
        for m, k in SHAPES + extra:
            if (fmt, mode) == ("q8_0", "fast") and k % 64:
                continue
            for t in (TOKENS if (m, k) in SHAPES else (9, 16) if (m, k) == WIDE else (3, 8)):
                for arch in (None, "sm_89"):
                    for forced in (FORCED if fmt in ("q4_K", "tq4_1s") else [{}]):  # the knobs pick their paths
                        for rotation in (("separate", "fused") if fmt == "tq4_1s" and mode == "exact" else ("separate",)):
                            yield fmt, mode, rotation, m, k, t, arch, forced


def moe_cases(r, rng, covered, only, n, worst, wrong):
    """mul_mat_id for each MoE format: the per-pair GEMV (T = 1, and T = 3 at these sizes) and the grouped GEMM route
    (T = 600 of 2 slots over 4, 16, 64 and 128 experts: each token tile, Q4_K's integer-weight build at 128; the
    pair-GEMV rule set to 0 so these small experts take it; Q4_K also with arch="sm_89", its mma.sync GEMM; sm_90:
    moe_gather, the register-A wgmma GEMM and the gated GEMV's arrival), x shared and per slot, ids on the device
    with two out of range (NaN rows)."""
    from ptxgen import tuning
    from ptxgen.runtime import ops

    for fmt, e in (("q4_K", 4), ("q4_K", 16), ("q4_K", 64), ("q4_K", 128), ("q5_K", 4), ("q5_K", 16), ("q5_K", 64),
                   ("q6_K", 4), ("q6_K", 16), ("q8_0", 4), ("q8_0", 16), ("q8_0", 64), ("tq4_1s", 4), ("tq4_1s", 16)):
        m, k, slots = 129, 512, 2  # T = 600: ~300 / 75 / 19 pairs an expert on 4 / 16 / 64: sm_90's 128 / 64 / 32 tiles
        raw = random_raw(fmt, e * m, k, rng)
        w = r.QuantTensor.from_raw(fmt, raw, (e, m, k))
        for t, arch in [(1, None), (3, None), (600, None)] + ([(600, "sm_89")] if fmt == "q4_K" else []):
            grouped = (lambda: tuning.override(moe_pair_max_weights=0)) if t == 600 else contextlib.nullcontext
            with grouped():
                route = ops.mul_mat_id_kernels(fmt, t, slots, e, k, m, arch)  # sm_89: Q4_K's mma.sync grouped GEMM
            if only and not set(route) & set(only):
                continue
            for per_slot in (False, True):
                ids = rng.integers(0, e, (t, slots)).astype(np.int32)
                ids[t // 2, 0], ids[t - 1, slots - 1] = -1, e
                x = rng.standard_normal((t, slots, k) if per_slot else (t, k)).astype(np.float32)
                with grouped():
                    y = r.mul_mat_id(w, r.as_device_array(x), r.as_device_array(ids), arch=arch)
                y = y.numpy() if hasattr(y, "numpy") else y  # NumPy back where as_device_array kept x's host origin
                want = formats.mul_mat_id_ref(fmt, raw, (e, m, k), x, ids)
                bad = np.isnan(want)
                err = float(np.linalg.norm((y - want)[~bad]) / max(np.linalg.norm(want[~bad]), 1e-30))
                bound = 1e-3 if len(route) > 1 else 1e-5  # the grouped GEMM: fp16 activations
                if not (np.isnan(y[bad]).all() and np.isfinite(y[~bad]).all() and err <= bound):
                    print(f"WRONG: mul_mat_id {fmt} {e}x{m}x{k} T={t} per_slot={per_slot}: relative error {err:.2e}")
                    wrong += 1
                worst = max(worst, err)
                covered.update(route)
                n += 1
    return n, worst, wrong


def main():
    import ptxgen.runtime as r
    from ptxgen.runtime import kernels, ops

    quick = "--quick" in sys.argv
    only = set(sys.argv[sys.argv.index("--only") + 1].split(",")) if "--only" in sys.argv else None
    rng = np.random.default_rng(0)
    covered, seen, n, worst, wrong = set(), set(), 0, 0.0, 0
    weights = {}
    for fmt, mode, rotation, m, k, t, arch, forced in cases():
        with knobs.override(**forced):
            key = (fmt, m, k)
            if key not in weights:
                raw = random_raw(fmt, m, k, rng)
                weights[key] = (r.QuantTensor.from_raw(fmt, raw, (m, k)), raw)
            w, raw = weights[key]
            plan = ops.mul_mat_plan(w, t, mode=mode, rotation=rotation, arch=arch)
            sig = (tuple(plan.kernels), fmt, mode, arch)
            if sig in seen or (quick and set(plan.kernels) <= covered) or (only and not only & set(plan.kernels)):
                continue
            seen.add(sig)
            x = rng.standard_normal((t, k)).astype(np.float32)
            y = r.mul_mat(w, x, mode=mode, rotation=rotation, arch=arch)
            q8 = any("q8" in name or "fast" in name for name in plan.kernels)  # int8 x Q8_1 kernels ran
            if fmt == "tq4_1s":  # exact: fp32 rotated x (its GEMMs: fp16); fast: its own reference (Q8_1 rotated x)
                want = (formats.gemv_tq4_1s_ref if mode == "exact" else formats.gemv_tq4_1s_fast_ref)(raw, m, k, x)
                bound = 1e-3 if mode == "exact" and any(name.startswith("mmq_") for name in plan.kernels) else 1e-5
            elif q8:  # exact integer dots against the product with the Q8_1-rounded x
                want, bound = formats.gemm_q8_1_ref(fmt, raw, m, k, x), 1e-5
            else:  # fp32 GEMVs ~1e-6, fp16 skinny / prefill GEMMs ~3e-4
                want, bound = formats.gemm_ref(fmt, raw, m, k, x), 1e-3
            err = float(np.linalg.norm(y - want) / max(np.linalg.norm(want), 1e-30))
            if not np.isfinite(y).all() or err > bound:
                print(f"WRONG: {fmt} {mode} {m}x{k} T={t} arch={arch} {forced}: relative error {err:.2e} > {bound:.0e}")
                wrong += 1
            worst = max(worst, err if not q8 and fmt != "tq4_1s" else 0.0)
            covered |= set(plan.kernels)
            n += 1
    n, worst, wrong = moe_cases(r, rng, covered, only, n, worst, wrong)
    r.synchronize()
    dispatchable = {name for name in kernels.manifest("sm_90a") | kernels.manifest("sm_89")
                    if name != "quantize_q8_1" and not (name.startswith("dequantize_") and not name.endswith("_frags"))
                    and not name.endswith(("_mc2", "_n192"))}
    print(f"{n} calls, {len(covered)} kernels covered; worst relative error of the fp32 / fp16 paths {worst:.1e}"
          + (f"; {wrong} WRONG" if wrong else ""))
    print("covered:", " ".join(sorted(covered)))
    if not only:
        print("not reached:", " ".join(sorted(dispatchable - covered - NOT_DISPATCHED)) or "none",
              f"(never dispatched by the rule, not swept: {' '.join(sorted(NOT_DISPATCHED))})")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
