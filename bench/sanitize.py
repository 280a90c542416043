"""Every kernel mul_mat and mul_mat_id can dispatch, at edge shapes, once each — the program compute-sanitizer runs:

    compute-sanitizer --tool memcheck  python3 bench/sanitize.py   (also racecheck, synccheck, initcheck)
    compute-sanitizer --tool racecheck python3 bench/sanitize.py --only gemv_q4_k_mma_t1_fused   (calls running it)
    bash bench/sanitize.sh                                          (all four tools, one log: $OUT/sanitize.log)
    python3 bench/sanitize.py --plan                                (no GPU: the kernels the sweep reaches on an H200)

Cases: each format and mode, T at the dispatch rule's edges (1, 2, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 129), M at
tile edges (1, 127, 128, 129, 300) and K of one or a few blocks, with the knobs that pick the paths the default
rule keeps for large matrices forced on, and the mma.sync lowering (arch="sm_89") beside the wgmma one; then
TARGETED, the smallest calls that reach the builds those shapes cannot (Q6_K's routes on rows of 16-byte
multiples, the register-A GEMMs that convert x themselves and each register-A tile at a small shape, the codecs'
builds behind a knob or an untimed rule); mul_mat_id likewise (MOE_TARGETED: Q6_K's register-A grouped GEMM, Q4_K's
n48 tiles, the other formats' mma.sync grouped GEMMs). Each call is checked against the float64 reference (a
sanitizer run must also compute the right thing). Prints the kernels covered and the dispatchable kernels that were
not; `--plan` prints the same lists from the plans alone, made on a stand-in H200 (ptxgen.testing.fakegpu).
"""
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
NOT_DISPATCHED = {"gemv_tq4_1s_tma_t4", "gemv_tq4_1s_tma_t8", "mmq_q4_k_q8_n16_pre", "mmq_q4_k_q8_n32", "mmq_q4_k_q8_n64",
                  "mmq_q4_k_q8_n64_pre"}
# emitted for sm_90a but dispatched on sm_120a only (the fp16 mma.sync GEMM's TMA reads a copy of x there; sm_90a's
# GEMMs map the caller's x itself), which an sm_90 GPU cannot run
SM120_ONLY = {"copy_f16"}


# the register-A GEMM keeps the T rule's token tile at any shape (ops._rega_fill_tile halves it where the plan splits K
# many ways, as it does on shapes of few 128-row tiles): its n128 and n256 builds at small M and K
RA_TILES = {"wgmma_ra_max_splits": 1 << 10, "wgmma_ra_min_split_steps": 0}
# (fmt, mode, M, K, tokens, arch, knobs, rules[, x dtype]): calls that reach builds the sweep's shapes do not
# (ops.mul_mat_plan on the stand-in H200 names them: `--plan`); x float32 unless named
NO_I8 = {"few_i8_max_tokens": {"q4_K": 0, "q5_K": 0, "q6_K": 0, "q8_0": 0}}
TARGETED = [
    # Q6_K on rows of 16-byte multiples (K a multiple of 2048): gemv_q6_k_mma_tma, mmq_q6_k_wgmma_ra_n64 / n128 / n256
    ("q6_K", "exact", 129, 2048, (2, 17, 65, 129), None, {}, RA_TILES),
    # the register-A GEMMs converting x themselves, each tile (by default from T = 1024 on one K split)
    *[(fmt, "exact", 129, 512, (33, 65, 129), None, {"PTXGEN_MMQ_CX": "1"}, RA_TILES)
      for fmt in ("q4_K", "q5_K", "q8_0")],
    # the codecs' mma.sync GEMMs on x converted first (by default from RULES.mmq_x16_min_work multiply-adds)
    *[(fmt, "exact", 129, 512, (17, 33, 65), "sm_89", {"PTXGEN_MMQ_X16": "1"}, {}) for fmt in ("q5_K", "q6_K", "q8_0")],
    # Q6_K's and Q8_0's few-token builds, in one launch and in two (one token: from RULES.codec_few_t1_min_weights)
    *[(fmt, "exact", 128, 512, (1, 2, 3, 5), None, forced, {"codec_few_t1_min_weights": 0})
      for fmt in ("q6_K", "q8_0") for forced in ({}, {"PTXGEN_Q4K_FUSED": "0"})],
    # ... and the routes behind them up to 8 tokens: the codecs' tensor-core GEMVs (TMA and bulk-copy builds) and
    # the fp32 codec GEMVs
    *[(fmt, "exact", m, k, (1, 2, 3, 5), None, {}, {"codec_few_max_tokens": {"q5_K": 32}, "codec_mma_t1_min_rows": 1})
      for fmt in ("q6_K", "q8_0") for m, k in ((129, 2048), (128, 512), (1, 256))],
    ("q8_0", "exact", 129, 288, (2, 3), None, {}, {}),  # K not a multiple of 256: the fp32 codec GEMV at 2-4 tokens
    # Q4_K's 8-token few build (5-8 tokens from q4k_t1_min_weights, where its CTAs fit one round)
    ("q4_K", "exact", 1024, 4096, (5, 8), None, {}, {}),
    # the few-token builds with records shared by the CTA's warps (not shipped: RULES.few_shared_min_tokens 0)
    *[(fmt, "exact", 1024, 4096, (3, 5), None, {"PTXGEN_Q4K_FUSED": "0", "PTXGEN_Q4K_T1": "1"},
       {"few_shared_min_tokens": {fmt: 1}, "codec_few_max_tokens": {"q5_K": 32, "q6_K": 8, "q8_0": 8, "tq4_1s": 8},
        "codec_few_t1_min_weights": 0})
      for fmt in ("q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s")],
    # the stream-K register-A GEMMs (not shipped: RULES.mmq_stream_k_min_gain 0 until timed), n256 and n128
    ("q4_K", "exact", 5120, 4096, (512,), None, {}, {"mmq_stream_k_min_gain": 0.01}),
    ("q4_K", "exact", 9000, 4096, (128,), None, {}, {"mmq_stream_k_min_gain": 0.01}),
    # TQ4_1S's few-token builds (not shipped: RULES.codec_few_max_tokens has no tq4_1s entry above 0 until timed)
    ("tq4_1s", "exact", 128, 512, (1, 2, 3, 5), None, {}, {"codec_few_max_tokens": {"tq4_1s": 8}}),
    # mode="fast"'s int8 lane GEMVs at every T they are built for (RULES.fast_lanes_max_tokens runs some nowhere)
    *[(fmt, "fast", 129, 512, (1, 2, 3, 5), None, {}, {"fast_lanes_max_tokens": 8})
      for fmt in ("q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s")],
    # Q5_K's codec GEMVs under 9 tokens (its few-token builds off) and its few-token builds in two launches
    ("q5_K", "exact", 129, 512, (2, 3, 5), None, {}, {"codec_few_max_tokens": {"q5_K": 0}}),
    ("q5_K", "exact", 129, 512, (1, 2, 3), None, {"PTXGEN_Q4K_FUSED": "0"}, {}),
    # the prepared route of the formats whose register-A GEMM takes every T by default
    *[(fmt, "exact", 129, 512, (40,), None, {}, {"codec_ra_mmq_min_tokens": 1 << 30})
      for fmt in ("q5_K", "q8_0", "tq4_1s")],
    # the fp16 few-token builds where the int8 ones take their T by default (RULES.few_i8_max_tokens), fused and not
    *[("q4_K", "exact", 2048, 4096, (1, 2), None, forced, NO_I8) for forced in ({}, {"PTXGEN_Q4K_FUSED": "0"})],
    *[(fmt, "exact", 128, 512, (1, 2, 3, 5), None, forced, {**NO_I8, "codec_few_t1_min_weights": 0})
      for fmt in ("q5_K", "q6_K", "q8_0") for forced in ({}, {"PTXGEN_Q4K_FUSED": "0"})],
    # fp16 activations: widened once for the fp32 kernels (convert_f32), permuted for the register-A GEMMs
    *[(fmt, "exact", 129, 512, (1, 4, 40, 129), arch, {}, {}, "float16")
      for fmt in ("q4_K", "q6_K", "q8_0") for arch in (None, "sm_89")],
    # ... into the few-token preps' _x16 builds (the two-launch path, as graph plans run it)
    *[(fmt, "exact", 2048, 4096, (1, 2, 3, 8), None, {"PTXGEN_Q4K_FUSED": "0"}, {"codec_few_t1_min_weights": 0},
       "float16") for fmt in ("q4_K", "q5_K", "q6_K", "q8_0")],
    ("q4_K", "exact", 2048, 4096, (1, 2), None, {"PTXGEN_Q4K_FUSED": "0"}, NO_I8, "float16"),
    ("q4_K", "exact", 2048, 4096, (8,), None, {"PTXGEN_Q4K_FUSED": "0"}, {"few_i8_max_tokens": {"q4_K": 8}}, "float16"),
    ("q4_K", "exact", 2048, 4096, (9, 16, 24), None, {}, {}, "float16"),  # the hi-only ones (t16h, skinny)
    *[(fmt, "exact", 2048, 4096, (9, 16), None, {}, {}, "float16") for fmt in ("q6_K", "q8_0")],  # (prep_sub16_t16h_x16)
    # the fp16 few-token builds' preps on fp16 x where the int8 ones take their T by default
    *[(fmt, "exact", 2048, 4096, (1, 2, 3, 8), None, {"PTXGEN_Q4K_FUSED": "0"},
       {**NO_I8, "codec_few_t1_min_weights": 0}, "float16") for fmt in ("q6_K", "q8_0")],
    ("q8_0", "exact", 129, 512, (4,), None, {}, NO_I8, "float16"),  # (its fp16 one-launch build on fp16 x)
    ("q4_K", "exact", 1024, 4096, (24,), None, {}, {}, "float16"),  # the plain wgmma GEMM's copy (copy_f16)
    ("q5_K", "exact", 129, 512, (1,), None, {}, {"codec_few_max_tokens": {"q5_K": 0}}, "float16"),  # its codec GEMV
    # the cluster split-K register-A GEMMs (RULES.mmq_cluster_split_max_splits; their tiles' clusters of up to 8
    # splits), n64 / n128 / n256, fp32 x after convert_f16 and fp16 x as it is
    *[(fmt, "exact", 129, k, (40, 65, 129), None, {}, {**RA_TILES, "mmq_cluster_split_max_splits": 8}, dt)
      for fmt, k in (("q4_K", 1024), ("q6_K", 2048)) for dt in ("float32", "float16")],
    # ... and Q6_K's on rows in groups of 8 (K not a multiple of 2048: kernels/mmq.py ROW_GROUP_NOTE)
    *[("q6_K", "exact", 136, 2304, (40, 65, 129), None, {}, {**RA_TILES, "mmq_cluster_split_max_splits": 8}, dt)
      for dt in ("float32", "float16")],
    # the eager one-launch few-token builds on fp16 x (their _x16 twins), int8 and fp16, and Q5_K's int8 one-token one
    *[(fmt, "exact", 2048, 4096, (1, 2, 3), None, {}, {**rules, "codec_few_t1_min_weights": 0}, "float16")
      for fmt in ("q4_K", "q5_K", "q6_K", "q8_0") for rules in ({}, NO_I8)],
    ("q5_K", "exact", 129, 512, (1,), None, {}, {"codec_few_t1_min_weights": 0}),
    # the fp32 codec GEMVs' _x16 twins at 2-16 tokens (their few-token builds off; Q8_0 on K not a multiple of 256)
    *[(fmt, "exact", 129, 512, (2, 3, 5, 9), None, {}, {"codec_few_max_tokens": {"q5_K": 0, "q6_K": 0, "q8_0": 0},
                                                         "codec_ra_mmq_min_tokens": 1 << 30}, "float16")
      for fmt in ("q5_K", "q6_K", "q8_0")],
    ("q8_0", "exact", 129, 288, (2, 3), None, {}, {}, "float16"),
    # the prepared route on fp16 fragments where rule mmq_f16a puts the f16a GEMM (Q5_K / Q6_K / Q8_0), fp32 and fp16
    # x (permute_f16), and the f16a GEMM converting x itself (by default from T = 1024 on one K split)
    *[(fmt, "exact", 129, 512, (40,), None, {}, {"mmq_f16a": False, "codec_ra_mmq_min_tokens": 1 << 30}, dt)
      for fmt in ("q5_K", "q6_K", "q8_0") for dt in ("float32", "float16")],
    *[(fmt, "exact", 129, 512, (33, 129), None, {"PTXGEN_MMQ_CX": "1"}, {"codec_ra_mmq_min_tokens": 1 << 30})
      for fmt in ("q5_K", "q8_0")],
]


def cases():
    """(fmt, mode, rotation, M, K, T, arch, knobs, rules) of every mul_mat call of the sweep, then TARGETED's. Every
    format in each mode its codec routes (ptxgen.codecs ROUTES), at the shapes it takes in that mode."""
    from ptxgen import codecs

    for fmt, codec in codecs.CODECS.items():
        for mode in codec.ROUTES:
            extra = {("q4_K", "exact"): (WIDE,), ("tq4_1s", "exact"): (BIG,)}.get((fmt, mode), ())
            for m, k in SHAPES + extra:
                if codec.weights_error(mode, k, 1 << 44):  # a K the format refuses in this mode (Q8_0 fast: K % 64)
                    continue
                for t in (TOKENS if (m, k) in SHAPES else (9, 16) if (m, k) == WIDE else (3, 8)):
                    for arch in (None, "sm_89"):
                        for forced in (FORCED if fmt in ("q4_K", "tq4_1s") else [{}]):  # the knobs pick their paths
                            rotations = ("separate", "fused") if (fmt, mode) == ("tq4_1s", "exact") else ("separate",)
                            for rotation in rotations:
                                yield fmt, mode, rotation, m, k, t, arch, forced, {}, "float32"
        for mode in codec.ROUTES:  # fp16 x: each route's _x16 twins (or x widened once), the default knobs
            for m, k in SHAPES:
                if codec.weights_error(mode, k, 1 << 44):
                    continue
                for t in TOKENS:
                    for arch in (None, "sm_89"):
                        yield fmt, mode, "separate", m, k, t, arch, {}, {}, "float16"
    for fmt, mode, m, k, tokens, arch, forced, rules, *x_dtype in TARGETED:
        for t in tokens:
            yield fmt, mode, "separate", m, k, t, arch, forced, rules, (x_dtype or ["float32"])[0]


GROUPED = {"moe_pair_max_weights": 0}  # the grouped routes: at these small sizes the pair GEMV's rule takes the calls
# (fmt, E, M, K, slots, T, arch, rules) of mul_mat_id calls the sweep's experts do not reach (mul_mat_id_kernels)
MOE_TARGETED = [
    # Q6_K's sm_90 grouped GEMM (register-A wgmma: rows of 16-byte multiples, K a multiple of 2048), each token tile by
    # the pairs an expert (RULES.moe_wgmma_tile_pairs): n32 (12), n64 (32), n128 (128); TQ4_1S's n32 likewise
    ("q6_K", 8, 129, 2048, 2, 48, None, GROUPED), ("q6_K", 4, 129, 2048, 2, 64, None, GROUPED),
    ("q6_K", 2, 129, 2048, 2, 128, None, GROUPED), ("tq4_1s", 8, 129, 512, 2, 48, None, GROUPED),
    # Q4_K's n48 tiles at 28 pairs an expert: the 256-row one (the rule's), the 128-row one where the rule names it
    ("q4_K", 4, 129, 512, 2, 56, None, GROUPED),
    ("q4_K", 4, 129, 512, 2, 56, None, {**GROUPED, "moe_wgmma_tile_pairs": {"n48": 24, "n64": 36, "n128": 128}}),
    # Q4_K's n64 at 48 pairs an expert (the sweep's T = 600 on 16 experts, 75 an expert, takes n80_m256)
    ("q4_K", 4, 129, 512, 2, 96, None, GROUPED),
    # Q6_K's grouped GEMM on rows that are not 16-byte multiples (K = 768: 8-row groups, rule moe_row_groups): n32,
    # n64, n128 by the pairs an expert (12, 40, 130)
    *[("q6_K", 8, 136, 768, 2, t, None, GROUPED) for t in (48, 160, 520)],
    # the other formats' mma.sync grouped GEMMs (arch="sm_89"): n32, and n64 from 48 pairs an expert
    *[(fmt, 4, 129, 512, 2, t, "sm_89", GROUPED) for fmt in ("q5_K", "q6_K", "q8_0", "tq4_1s") for t in (48, 100)],
]


def moe_calls():
    """(fmt, E, M, K, slots, T, arch, rules, x dtype) of every mul_mat_id call: each MoE format's per-pair GEMV (T = 1,
    and T = 3 at these sizes) and its grouped GEMM route (T = 600 of 2 slots over 4, 16, 64 and 128 experts: each
    token tile, Q4_K's integer-weight build at 128; the pair-GEMV rule set to 0 so these small experts take it; Q4_K
    also with arch="sm_89", its mma.sync GEMM), then MOE_TARGETED's; then fp16 x (the _x16 twins) on 4 experts, and
    on 128 for Q4_K's integer-weight route."""
    for fmt, e in (("q4_K", 4), ("q4_K", 16), ("q4_K", 64), ("q4_K", 128), ("q5_K", 4), ("q5_K", 16), ("q5_K", 64),
                   ("q6_K", 4), ("q6_K", 16), ("q8_0", 4), ("q8_0", 16), ("q8_0", 64), ("tq4_1s", 4), ("tq4_1s", 16)):
        # T = 600: ~300 / 75 / 19 pairs an expert on 4 / 16 / 64: sm_90's 128 / 64 / 32 tiles
        for t, arch in [(1, None), (3, None), (600, None)] + ([(600, "sm_89")] if fmt == "q4_K" else []):
            yield fmt, e, 129, 512, 2, t, arch, GROUPED if t == 600 else {}, "float32"
    for call in MOE_TARGETED:
        yield *call, "float32"
    for fmt, e in (("q4_K", 4), ("q4_K", 128), ("q5_K", 4), ("q6_K", 4), ("q8_0", 4), ("tq4_1s", 4)):
        for t in (1, 600):
            yield fmt, e, 129, 512, 2, t, None, GROUPED if t == 600 else {}, "float16"
    yield "q6_K", 4, 129, 2048, 2, 600, None, GROUPED, "float16"  # (its register-A grouped GEMM: rows of 16-byte multiples)


def moe_route(w, t: int, slots: int, arch, rules, x_dtype: str) -> list:
    """The kernels of mul_mat_id(w, x (T, K) of `x_dtype`, ids (T, slots)) under `rules`."""
    from ptxgen import tuning
    from ptxgen.runtime import ops

    with tuning.override(**rules):
        return ops.mul_mat_id_plan(w, t, slots, arch=arch, x_dtype=x_dtype).kernels


def dispatchable() -> set:
    """The emitted kernels a sweep should reach: every sm_90a and sm_89 build but quantize_q8_1, the plain dequantize
    kernels and the builds the rule never picks (_mc2, _n192, NOT_DISPATCHED)."""
    from ptxgen.runtime import kernels

    return {name for name in kernels.manifest("sm_90a") | kernels.manifest("sm_89")
            if name != "quantize_q8_1" and not (name.startswith("dequantize_") and not name.endswith("_frags"))
            and not name.endswith(("_mc2", "_n192"))} - NOT_DISPATCHED - SM120_ONLY


def plan_only():
    """--plan: the sweep's plans on a stand-in H200 (nothing launches, no GPU needed); prints what main would cover
    and how many calls it would run, in full and with --quick (a call whose kernels are all covered is left out)."""
    import pytest

    from ptxgen import tuning
    from ptxgen.runtime import ops
    from ptxgen.testing import fakegpu

    fakegpu.install(pytest.MonkeyPatch())
    quick, seen, weights, calls = set(), set(), {}, [0, 0]  # quick: the kernels covered so far
    for fmt, mode, rotation, m, k, t, arch, forced, rules, x_dtype in cases():
        with knobs.override(**forced), tuning.override(**rules):
            w = weights.setdefault((fmt, m, k), fakegpu.weights(fmt, m, k, at=fakegpu.BASE + (len(weights) << 32)))
            plan = ops.mul_mat_plan(w, t, mode=mode, rotation=rotation, arch=arch, x_dtype=x_dtype)
        sig = (tuple(plan.kernels), fmt, mode, arch, x_dtype)
        if sig not in seen:  # main's calls: one per kernel sequence; --quick: only those that add a kernel
            seen.add(sig)
            calls[0] += 1
            calls[1] += not set(plan.kernels) <= quick
            quick |= set(plan.kernels)
    dense = list(calls)
    for i, (fmt, e, m, k, slots, t, arch, rules, x_dtype) in enumerate(moe_calls()):
        w = fakegpu.weights(fmt, m, k, at=fakegpu.BASE + ((len(weights) + i) << 32), experts=e)
        route = set(moe_route(w, t, slots, arch, rules, x_dtype))
        calls[0] += 2  # x shared, x per slot
        calls[1] += 2 * (not route <= quick)
        quick |= route | {"moe_check_ids"}  # (each call counts its bad ids: errors=)
    print(f"{calls[0]} calls ({calls[1]} with --quick; mul_mat {dense[0]} ({dense[1]})) planned on the stand-in H200, "
          f"{len(quick)} kernels covered")
    print("covered:", " ".join(sorted(quick)))
    print("not reached:", " ".join(sorted(dispatchable() - quick)) or "none",
          f"(never dispatched by the rule, not swept: {' '.join(sorted(NOT_DISPATCHED))})")


def moe_cases(r, rng, covered, only, quick, n, worst, wrong):
    """mul_mat_id's calls (moe_calls), x shared and per slot, ids on the device with two out of range (NaN rows,
    counted by errors=); sm_90: moe_gather, the register-A wgmma GEMM and the gated GEMV's arrival."""
    from ptxgen import tuning

    experts = {}
    for fmt, e, m, k, slots, t, arch, rules, x_dtype in moe_calls():
        if (fmt, e, m, k) not in experts:
            raw = random_raw(fmt, e * m, k, rng)
            experts[fmt, e, m, k] = (r.QuantTensor.from_raw(fmt, raw, (e, m, k)), raw)
        w, raw = experts[fmt, e, m, k]
        route = moe_route(w, t, slots, arch, rules, x_dtype)  # sm_89: the mma.sync grouped GEMMs
        if (only and not set(route) & set(only)) or (quick and set(route) <= covered):
            continue
        for per_slot in (False, True):
            ids = rng.integers(0, e, (t, slots)).astype(np.int32)
            ids[t // 2, 0], ids[t - 1, slots - 1] = -1, e
            x = rng.standard_normal((t, slots, k) if per_slot else (t, k)).astype(x_dtype)  # (references widen it)
            errors = r.DeviceArray.empty((1,), np.uint32)
            errors.owner.fill_bytes(0)
            with tuning.override(**rules):
                y = r.mul_mat_id(w, r.as_device_array(x), r.as_device_array(ids), arch=arch, errors=errors)
            y = y.numpy() if hasattr(y, "numpy") else y  # NumPy back where as_device_array kept x's host origin
            want = formats.mul_mat_id_ref(fmt, raw, (e, m, k), x, ids)
            bad = np.isnan(want)
            err = float(np.linalg.norm((y - want)[~bad]) / max(np.linalg.norm(want[~bad]), 1e-30))
            bound = 1e-3 if len(route) > 1 else 1e-5  # the grouped GEMM: fp16 activations
            counted = int(errors.numpy()[0]) == int(((ids < 0) | (ids >= e)).sum())
            if not (np.isnan(y[bad]).all() and np.isfinite(y[~bad]).all() and err <= bound and counted):
                print(f"WRONG: mul_mat_id {fmt} {e}x{m}x{k} T={t} x {x_dtype} arch={arch} per_slot={per_slot}: "
                      f"relative error {err:.2e}")
                wrong += 1
            worst = max(worst, err)
            covered.update(route + ["moe_check_ids"])
            n += 1
    return n, worst, wrong


def reads_q8_1(names) -> bool:
    """Whether a plan's kernels compute on x rounded to Q8_1: after one of its quantizing preps, or the int8 MMQ
    (mmq_<fmt>_q8_n*, the n16 build quantizing inside), on fp32 or fp16 x (the preps' _x16 twins). Format names are no
    sign: q8_0's exact kernels read fp32 x."""
    return any(n.removesuffix("_x16") in ("prep_q8_lanes", "prep_tq4_1s_q8", "quantize_q8_1_mmq") or "_q8_n" in n
               for n in names)


def main():
    if {"-h", "--help"} & set(sys.argv):
        print(__doc__.rstrip() + "\n\n    --quick: skip the calls whose kernels earlier ones covered; --only K1,K2: only the "
              "calls running those kernels")
        return None
    if "--plan" in sys.argv:
        return plan_only()
    import ptxgen.runtime as r
    from ptxgen import tuning
    from ptxgen.runtime import ops

    quick = "--quick" in sys.argv
    only = set(sys.argv[sys.argv.index("--only") + 1].split(",")) if "--only" in sys.argv else None
    rng = np.random.default_rng(0)
    covered, seen, n, worst, wrong = set(), set(), 0, 0.0, 0
    weights = {}
    for fmt, mode, rotation, m, k, t, arch, forced, rules, x_dtype in cases():
        with knobs.override(**forced), tuning.override(**rules):
            key = (fmt, m, k)
            if key not in weights:
                raw = random_raw(fmt, m, k, rng)
                weights[key] = (r.QuantTensor.from_raw(fmt, raw, (m, k)), raw)
            w, raw = weights[key]
            plan = ops.mul_mat_plan(w, t, mode=mode, rotation=rotation, arch=arch, x_dtype=x_dtype)
            sig = (tuple(plan.kernels), fmt, mode, arch, x_dtype)
            if sig in seen or (quick and set(plan.kernels) <= covered) or (only and not only & set(plan.kernels)):
                continue
            seen.add(sig)
            x = rng.standard_normal((t, k)).astype(x_dtype)  # the references widen it exactly
            y = r.mul_mat(w, x, mode=mode, rotation=rotation, arch=arch)
            q8 = reads_q8_1(plan.kernels)  # int8 x Q8_1 kernels ran (mode="fast" runs exact ones past its cut-offs)
            if fmt == "tq4_1s":  # fp32 rotated x (its GEMMs: fp16); Q8_1: its own reference (Q8_1 rotated x)
                want = (formats.gemv_tq4_1s_fast_ref if q8 else formats.gemv_tq4_1s_ref)(raw, m, k, x)
                bound = 1e-3 if any(name.startswith("mmq_") for name in plan.kernels) else 1e-5
            elif q8:  # exact integer dots against the product with the Q8_1-rounded x
                want, bound = formats.gemm_q8_1_ref(fmt, raw, m, k, x), 1e-5
            else:  # fp32 GEMVs ~1e-6, fp16 skinny / prefill GEMMs ~3e-4
                want, bound = formats.gemm_ref(fmt, raw, m, k, x), 1e-3
            err = float(np.linalg.norm(y - want) / max(np.linalg.norm(want), 1e-30))
            if not np.isfinite(y).all() or err > bound:
                print(f"WRONG: {fmt} {mode} {m}x{k} T={t} x {x_dtype} arch={arch} {forced} {rules}: relative error {err:.2e} > "
                      f"{bound:.0e}")
                wrong += 1
            worst = max(worst, err if not q8 and fmt != "tq4_1s" else 0.0)
            covered |= set(plan.kernels)
            n += 1
    n, worst, wrong = moe_cases(r, rng, covered, only, quick, n, worst, wrong)
    r.synchronize()
    print(f"{n} calls, {len(covered)} kernels covered; worst relative error of the fp32 / fp16 paths {worst:.1e}"
          + (f"; {wrong} WRONG" if wrong else ""))
    print("covered:", " ".join(sorted(covered)))
    if not only:
        print("not reached:", " ".join(sorted(dispatchable() - covered)) or "none",
              f"(never dispatched by the rule, not swept: {' '.join(sorted(NOT_DISPATCHED))})")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
