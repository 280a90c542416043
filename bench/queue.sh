#!/usr/bin/env bash
# The pending device measurements, as named steps, so that a device call runs them without composing commands:
#   bash bench/queue.sh tier sk          (device tool; each step's logs land in $OUT as <step>_*.log)
# Steps, in the order bench/NOTES.md's latest "Next" list gives them (a 10-minute call fits "tier sk" or
# "model tq4few", roughly):
#   tier     the GPU tier (~5 min)
#   sk       stream-K register-A GEMMs against the uniform plans (rule mmq_stream_k_min_gain)
#   model    bench_model on fp32 x, then on fp16 x (#34's decode and prefill rows; run it on an H200)
#   i34      #34's per-format rows at HEAD: bench_op Q5_K / Q6_K / Q8_0 4096x14336 at T = 16 / 512 / 4096, Q4_K
#            and TQ4_1S 18944x3584 at T = 512, bench_gemv's graph-replayed T = 1 loop of Q5_K / Q6_K / Q8_0
#   t16c     the codecs' t16h builds against the GEMM at 9 / 16 tokens (ran 2026-12-06 and shipped: the variant is now
#            the shipped rule; retime with rule.codec_few_max_tokens 8 as the variant)
#   i8q8     Q8_0's int8 few-token builds against the fp16 ones (ran 2026-12-06 and shipped, as t16c)
#   xrot     bench_op eager / graph on fp16 x rotating over 1, 8, 40 x buffers (a tensor-map encode per new address)
#   fixup    bench_model's prefill on fp32 x with the fixup at 4 CTAs an SM (shipped) and at 1 (rule fixup_ctas_per_sm)
#   tq4rot   TQ4_1S's prefill with its rotation writing the GEMM's fp16 copy (rotate_tq4_1s_f16) against the
#            launches before it (knob PTXGEN_ROTATE_F16=0), fp32 and fp16 x, on 18944x3584
#   tq4few   TQ4_1S on the few-token tensor-core builds (rule codec_few_max_tokens[tq4_1s])
#   xt       TQ4_1S T = 1 on the product-table GEMV (rule xtab_max_tokens; x loaded early or not) against the lane
#            GEMVs, and its GPU tests (a loss on both cards, 2026-12-06)
#   ncu_xt   ncu source counters and stall reasons of gemv_tq4_1s_xt_t1 on 18944x3584
#   t8       T = 8: records shared by the CTA (rule few_shared_min_tokens) and the two-tile per-warp plan
#   tq4shared TQ4_1S at 4-8 tokens on the few-token builds whose records the CTA shares
#   i8       the int8 few-token Q4_K / Q5_K / Q6_K GEMVs (rule few_i8_max_tokens) against the fp16 ones; their GPU == emulator tests
#   ncu_t8   ncu source counters and stall reasons of gemv_q4_k_mma_t8 (T = 8) and gemv_tq4_1s_tma_t1 (#36)
#   ncu_i8   ncu source counters and stall reasons of gemv_q4_k_i8_t1 (the graph loop's build) on 4096x14336
#   gapsdec  one decode layer's 7 ops in turn on fp32 and fp16 x: kernels and gaps at each op boundary
#   t16plan  the t16h builds' plan at 6 and 8 warps an SM against 4 (Q6_K / Q8_0 T = 16)
#   kp       K parts inside the CTA for the small one-token codec GEMVs (ran 2026-12-06 as compile-time builds; now
#            the kparts launch parameter: step kpr)
#   kpr      the one-token codec GEMVs' kparts parameter (rule codec_gemv_t1_max_ctas) against kparts 1, Q8_0 at the
#            rule's 256 too, fp32 and fp16 x; then their GPU tests
#   q5small  Q5_K's small one-token ops on its codec GEMV (route small_gemv, kparts) against prep + int8 GEMV
#   xtsmall  TQ4_1S's small one-token ops (Qwen's attn_k / attn_v 512x3584, 4.8 µs an op) on the one-launch product-table GEMV
#   fusedg   the one-launch int8 builds (records built by the CTAs) in a graph against prep + GEMV (knob PTXGEN_Q4K_FUSED)
#   tq4fused TQ4_1S's one- to four-token calls with rotation="fused" (one launch) against "separate", small and large shapes
#   cs64     1024x4096 T = 512 on n64 tiles split 2 ways as clusters of 2 (mmq_q[46]_k_wgmma_ra_n64_cs), and converting x in the GEMM
#   ncu_smallm ncu of the register-A GEMM on attn_k's 1024x4096 at T = 512 (0.55x cuBLAS in every format)
#   cs       the cluster split-K builds (rule mmq_cluster_split_max_splits) against the split builds: probe at
#            1024x4096 / 4096x4096 T = 512, then bench_model --prefill-only with the rule at 4 and at 0
#   mid      the one-token codec GEMV with kparts on 4096x4096 (bench_model's attn_q / attn_output) against the few builds
#   ncu_t16q8 ncu sections of gemv_q8_0_mma_t16h on 4096x14336 against 14336x4096 (#34's Q8_0 T = 16)
#   hold8    the one-token builds' ring-stage hold (gemv_t1.T1_HOLD) for Q4_K / Q5_K at 2, 4, 8 tokens (ran
#            2026-12-06: 2 tokens shipped)
#   pre      the prepared GEMM (fp16 fragments once, then wgmma) on small-M prefill ops (attn_k's 1024x4096)
#   prefill  bench_model's prefill alone, as is, on fp16 activations, under candidate rules (converting GEMM, stream-K)
#   x16      bench_op on fp16 activations against fp32 ones (decode's widening, prefill's permute)
#   x16moe   bench_moe on fp16 x against fp32 x (mul_mat_id's _x16 twins), T = 1 / 32 / 512
#   x16tq    bench_op TQ4_1S 18944x3584 on fp16 x against fp32 x (its _x16 preps, the fused rotation), T = 1-512
#   x16model bench_model on fp16 activations (prefill alone, plain and --fuse; then the decode step)
#   gaps     kernels and launch gaps of the prefill ops of bench_model (T = 512; probe_op_gaps)
#   gaps16   the same on fp16 x (what permute_f16 costs an op)
#   small    small one-token ops: the one-launch fused build, the fp32 codec GEMV (rule codec_gemv_t1_max_weights)
#   rest     bench_gemv fast lanes, the prepared GEMM for small-M prefill, the converting GEMM at T = 512
#   sanitize bench/sanitize.sh (plain, then memcheck / racecheck / synccheck / initcheck on --quick)
#   sweep    bench/sanitize.py without a sanitizer: every dispatchable kernel against float64
#   capfree  the review's probe of relaxed cuMemFree (blocking / non-blocking capture streams, a free from another
#            thread, eager work in flight), whether a cuMemFree inside relaxed_capture keeps a torch capture
#            (probe_capture_free.py), then the capture tests of test_gpu_streams
#   tiny     the GPU tests of tokens too small for fp16 (the conversions' flag, the fixup) and the overflow ones
#   g8       #34: memcheck on Q6_K's row-group builds, then bench_op on Qwen2.5-7B's Q6_K shapes (18944x3584, 3584x18944)
#   f16a     #34: the f16a GEMM (rule mmq_f16a: dequantize_<fmt> to fp16 rows, then both wgmma operands from shared
#            memory) — its GPU tests, then bench_op-style A/B against the shipped route and the prepared one, Q8_0 /
#            Q4_K / Q5_K / Q6_K 4096x14336 at T = 1024 / 2048 / 4096 on fp32 x (F16A_X="float32 float16": both)
#   moel1    #35: mul_mat_id without its gated GEMV (the gate's cost: L1's ceiling), both shapes, T = 32 / 512
#   gpusub   the GPU tests of the runtime's entry points (MoE, runtime, streams, quick start) — after a change there
#   q6nat    Q6_K's register-A GEMMs in x's natural K order (shipped) against the permuted order, T = 512, x
#            fp16 and fp32, on bench_model's Q6_K shapes (the output's 128256 rows lost ~4% on an H100)
#   wide     #35: the 256-row n64 / n80 MoE trial tiles against the shipped n64 (32 x top-4 T = 448-576, 128 x top-8 T = 768 / 1024)
#   gate     #35: the gated GEMV's grid.y 1 against 4 (GATED_EXPERT_CTAS), both shapes, T = 32 / 512
#   perm8    Q8_0's register-A GEMMs in the permuted K order against the natural one on fp32 x, 4096x14336 T = 512 / 4096
#   perm32   the Q4_K / Q6_K register-A GEMMs in the permuted K order against the natural one on fp32 x (bench_model's shapes)
#   gflag    the GPU tier at HEAD (2026-12-07's partial run reached 92%), then bench_op's prefill conversions on an older
#            emitted/ (abold, from 05e92f5: the word tests) and this tree's (convert_f16.conversion_flag), alternating:
#            `rm -rf abold && mkdir abold && git archive 05e92f5 emitted/sm_90a | tar -x -C abold && (cd abold/emitted/sm_90a
#            && ls | grep -v -E '^(manifest|convert|dequantize|mul_mat_fixup|permute|mmq_q[458]_[0k]_wgmma_(ra|f16a))' |
#            xargs rm)` (~3 MB; the device call's carry=["abold"])
#   minlo    #35: the grouped register-A Q4_K builds decoding two instructions a pair, −m_lo as a min-term MMA on the
#            gather's sub-block sums (mmq.RA_MIN_LO_MMA; bench/results/study_min_term_mma_2026-12-07.md) against the
#            shipped decode, both bench_moe shapes, T = 128 / 512; then its emulator tests on the GPU's machine
#   mlbench  bench_moe's rows at HEAD
#   ncu_moe  ncu source counters and stall reasons of the grouped register-A GEMMs at T = 512 (n48_m256, n80_m256)
#   i34q8    #34's last cell alone, three runs (Q8_0 4096x14336 T = 4096 eager; needs an H200)
#   mlship   #35: the −m_lo MMA shipped (mmq.RA_MIN_LO_MMA on): its builds and moe_gather_sums under memcheck /
#            racecheck / synccheck, then test_gpu_moe
#   abemit   bench_model on an older emitted/ and this tree's, alternating twice (x float16): prepare the old one
#            here with `rm -rf abold && mkdir abold && git archive REV emitted | tar -x -C abold` and pass the
#            device call carry=["abold"] (ignored by git, so only carry takes it there)
# QUEUE_LIMIT (seconds, default 560) stops starting steps once that much of the call has passed.
set -uo pipefail
OUT=${OUT:-/tmp/ptxgen-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PTXGEN_CACHE_DIR=${PTXGEN_CACHE_DIR:-/tmp/ptxgen-cache} HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
start=$SECONDS
limit=${QUEUE_LIMIT:-560}
AB=(python3 bench/probe_build_ab.py)  # (timeout runs programs, not shell functions)

# run NAME SECONDS CMD...: one measurement under its own time limit, its output in $OUT/NAME.log (tail shown)
run() {
  local name=$1 secs=$2; shift 2
  local left=$((limit - (SECONDS - start)))
  if [ "$left" -le 20 ]; then echo "== $name: skipped (the call's time is spent)"; return; fi
  [ "$secs" -gt "$left" ] && secs=$left
  echo "== $name (limit ${secs}s)"
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  tail -n 30 "$OUT/$name.log"; echo "== $name rc=$rc at $((SECONDS - start))s"
}

few_rule='rule.codec_few_max_tokens={"q5_K": 32, "q6_K": 8, "q8_0": 8, "tq4_1s": 8}'
mt2='gemv_t1.T1_PLAN={"big": {"t1": (4, 2, 1, 8), "t2": (3, 2, 1, 8), "t4": (2, 2, 1, 8), "t8": (2, 2, 2, 4), "t16h": (3, 1, 2, 4)}, "small": {"t1": (3, 2, 1, 4), "t2": (2, 2, 1, 4), "t4": (2, 1, 1, 4), "t8": (2, 1, 1, 4), "t16h": (2, 1, 1, 4)}}'

t16w6='gemv_t1.T1_PLAN={"big": {"t1": (4, 2, 1, 8), "t2": (3, 2, 1, 8), "t4": (2, 2, 1, 8), "t8": (2, 2, 1, 4), "t16h": (3, 1, 2, 6)}, "small": {"t1": (3, 2, 1, 4), "t2": (2, 2, 1, 4), "t4": (2, 1, 1, 4), "t8": (2, 1, 1, 4), "t16h": (2, 1, 1, 4)}}'
t16w8='gemv_t1.T1_PLAN={"big": {"t1": (4, 2, 1, 8), "t2": (3, 2, 1, 8), "t4": (2, 2, 1, 8), "t8": (2, 2, 1, 4), "t16h": (3, 1, 1, 8)}, "small": {"t1": (3, 2, 1, 4), "t2": (2, 2, 1, 4), "t4": (2, 1, 1, 4), "t8": (2, 1, 1, 4), "t16h": (2, 1, 1, 4)}}'

for step in "${@:-tier}"; do
  case $step in
  tier)
    run gpu_tier 540 python3 -m pytest -q -ra -p no:cacheprovider -m gpu -n 14 --dist load ;;
  sk)
    run sk_14336x4096 120 "${AB[@]}" --kernels 'mmq_q4_k_wgmma_ra_n256_sk$' --formats q4_K --shape 14336x4096 --tokens 512,1024 \
      --variant 'sk: rule.mmq_stream_k_min_gain=0.01'
    for s in 5120x4096 28672x4096; do
      run "sk_$s" 90 "${AB[@]}" --kernels 'mmq_q4_k_wgmma_ra_n256_sk$' --formats q4_K --shape "$s" --tokens 512 \
        --variant 'sk: rule.mmq_stream_k_min_gain=0.01'
    done
    run sk_tq4_1s 90 "${AB[@]}" --kernels 'mmq_tq4_1s_wgmma_ra_n256_sk$' --formats tq4_1s --shape 18944x3584 --tokens 512 \
      --variant 'sk: rule.mmq_stream_k_min_gain=0.01' ;;
  model)
    run model 150 python3 bench/bench_model.py
    run model_x16 150 python3 bench/bench_model.py --x-dtype float16 ;;
  i34)  # every per-format row of #34's table at HEAD (the op as called: eager, graph, kernel; llama.cpp beside)
    run i34_op 240 python3 bench/bench_op.py --formats q5_K,q6_K,q8_0 --shape 4096x14336 --tokens 16,512,4096 \
      --no-decode-loop --reps 10
    run i34_tq 90 python3 bench/bench_op.py --formats q4_K,tq4_1s --shape 18944x3584 --tokens 512 --no-decode-loop --reps 10
    run i34_gemv 150 python3 bench/bench_gemv.py --formats q5_K,q6_K,q8_0 --shapes 4096x14336 --tokens 1 --modes exact ;;
  i34q8)  # #34's last cell alone (Q8_0 4096x14336 T = 4096, eager on fp32 x: 828 on the H200 at f60af93, goal 822),
    # three runs, to read where the power-limited loop's ±2-4% spread sits on this card
    for i in 1 2 3; do
      run "i34q8_$i" 60 python3 bench/bench_op.py --formats q8_0 --shape 4096x14336 --tokens 4096 --no-decode-loop --reps 10
    done ;;
  xrot)  # the op as called, eager, on fp16 x through the natural-order GEMMs: one x buffer, 8 (the per-address
    # tensor maps memoised), 40 (every call encodes one on the host); Q4_K and Q6_K 4096x14336, T = 64 / 512
    for n in 1 8 40; do
      run "xrot_$n" 150 python3 bench/bench_op.py --formats q4_K,q6_K --shape 4096x14336 --tokens 64,512 \
        --x-dtype float16 --x-buffers "$n" --no-decode-loop --reps 10
    done ;;
  fixup)  # the no-op fixup behind each fp32-x prefill GEMM: 4 CTAs an SM (shipped) against one wave, alternating
    for i in 1 2; do
      run "fixup_4_$i" 100 python3 bench/bench_model.py --prefill-only
      run "fixup_1_$i" 100 python3 bench/bench_model.py --prefill-only --rule fixup_ctas_per_sm=1
    done ;;
  tq4rot)
    for d in float32 float16; do
      run "tq4rot_$d" 120 "${AB[@]}" --kernels 'rotate_tq4_1s_f16$' --formats tq4_1s --shape 18944x3584 \
        --tokens 17,64,512 --weights 8 --x-dtype "$d" --variant 'old: knob.PTXGEN_ROTATE_F16=0'
    done ;;
  xt)  # #36's TQ4_1S T = 1 (20.1 µs, goal 14.2): gemv_tq4_1s_xt_t1 (one launch, x's products by qs byte) against
    # prep_tq4_1s + gemv_tq4_1s_tma_t1, graph-replayed over 24 weights; then its GPU tests and GPU == emulator
    run xt_gpu_tests 120 python3 -m pytest -q -x -p no:cacheprovider -m gpu -n 8 tests/test_gpu_gemv.py \
      tests/test_gpu_emu_crosscheck.py -k 'product_table or xt_t1'
    for s in 18944x3584 3584x18944; do
      run "xt_$s" 110 "${AB[@]}" --kernels 'gemv_tq4_1s_xt_t1$' --formats tq4_1s --shape "$s" --tokens 1 --weights 24 \
        --variant 'xt: rule.xtab_max_tokens={"tq4_1s": 1}' \
        --variant 'nopf: rule.xtab_max_tokens={"tq4_1s": 1}; gemv_xt.XT_PREFETCH=False'
    done ;;
  t16c)  # #34's Q6_K / Q8_0 T = 16 cells (39.4 / 33.1 eager on the GEMM; goals 37.7 / 32.8): the codecs' t16h builds
    for s in 4096x14336 14336x4096 1024x4096; do
      run "t16c_$s" 100 "${AB[@]}" --kernels 'gemv_(q6_k|q8_0)_mma_t16h$|prep_sub16_t16h$' --formats q6_K,q8_0 --shape "$s" \
        --tokens 9,16 --weights 24 --variant 't16h: rule.codec_few_max_tokens={"q5_K": 32, "q6_K": 16, "q8_0": 16, "tq4_1s": 0}'
    done ;;
  i8q8)  # #36's Q8_0 T = 1 (21.6 µs graph, 63% of the floor): the int8 s8 x s8 builds against the fp16 ones, then their GPU tests
    for s in 4096x14336 14336x4096 1024x4096; do
      run "i8q8_$s" 100 "${AB[@]}" --kernels 'gemv_q8_0_i8_t|prep_q6k_i8_t' --formats q8_0 --shape "$s" --tokens 1,2,4,8 \
        --weights 24 --variant 'i8: rule.few_i8_max_tokens={"q4_K": 2, "q5_K": 4, "q6_K": 8, "q8_0": 8}'
    done
    run i8q8_gpu_tests 120 python3 -m pytest -q -x -p no:cacheprovider -m gpu -n 8 tests/test_gpu_gemv.py \
      tests/test_gpu_emu_crosscheck.py -k 'q8_0 and (int8 or i8)' ;;
  ncu_xt)
    run ncu_xt_src 150 ncu --kernel-name regex:gemv_tq4_1s_xt_t1 --launch-skip 3 --launch-count 1 --section WarpStateStats \
      --section SourceCounters --section SpeedOfLight --section Occupancy --page source --print-source sass --csv \
      python3 bench/profile_gemv.py tq4_1s 18944 3584 1 exact '{"xtab_max_tokens": {"tq4_1s": 1}}'
    python3 bench/ncu_source_top.py "$OUT/ncu_xt_src.log" 45 > "$OUT/ncu_xt_top.log" 2>&1; tail -n 50 "$OUT/ncu_xt_top.log" ;;
  tq4few)
    for s in 18944x3584 3584x18944; do
      run "tq4few_$s" 150 "${AB[@]}" --kernels 'gemv_tq4_1s_mma_t' --formats tq4_1s --shape "$s" --tokens 1,2,3,4,8 --weights 24 \
        --variant "few: $few_rule" --variant "few_default_plans: $few_rule; gemv_t1.T1_PLAN_FMT={}"
    done ;;
  t8)
    for s in 4096x14336 14336x4096; do
      run "t8_$s" 150 "${AB[@]}" --kernels 'gemv_q[45]_k_mma_t[48]s?$' --formats q4_K,q5_K --shape "$s" --tokens 4,5,8 --weights 24 \
        --variant 'shared: rule.few_shared_min_tokens={"q4_K": 4, "q5_K": 4}' --variant "mt2: $mt2"
    done
    run t8_codecs 150 "${AB[@]}" --kernels 'gemv_(q6_k|q8_0|tq4_1s)_mma_t[48]s?$' --formats q6_K,q8_0,tq4_1s --shape 4096x14336 \
      --tokens 4,8 --weights 24 --variant "shared: $few_rule; rule.few_shared_min_tokens={\"q6_K\": 4, \"q8_0\": 4, \"tq4_1s\": 4}" ;;
  tq4shared)
    for s in 18944x3584 3584x18944 4096x14336; do
      run "tq4shared_$s" 120 "${AB[@]}" --kernels 'gemv_tq4_1s_mma_t[48]s$' --formats tq4_1s --shape "$s" --tokens 4,6,8 \
        --weights 24 --variant "shared: $few_rule; rule.few_shared_min_tokens={\"tq4_1s\": 4}"
    done ;;
  i8)
    for s in 4096x14336 14336x4096 1024x4096; do
      run "i8_$s" 150 "${AB[@]}" --kernels 'gemv_q[456]_k_i8_t|prep_q[46]k_i8_t' --formats q4_K,q5_K,q6_K --shape "$s" \
        --tokens 1,2,4,8 --weights 24 --variant 'i8: rule.few_i8_max_tokens={"q4_K": 8, "q5_K": 8, "q6_K": 8}'
    done
    run i8_gpu_tests 120 python3 -m pytest -q -x -p no:cacheprovider -m gpu -n 8 tests/test_gpu_emu_crosscheck.py tests/test_gpu_gemv.py -k 'i8 or int8' ;;
  hold8)  # #36 T = 8 (Q4_K 19.6 = 1.59x T = 1; <= 1.3x asked): the one-token builds' hold (a ring stage copied after
    # griddepcontrol.wait, 14.7 -> 14.0 at T = 1) for the 2-8-token builds too, Q4_K and Q5_K, graph over 24 weights
    for s in 4096x14336 14336x4096; do
      run "hold8_$s" 100 "${AB[@]}" --kernels 'gemv_q[45]_k_(mma|i8)_t[248]$' --formats q4_K,q5_K --shape "$s" \
        --tokens 2,4,8 --weights 24 --variant 'h: gemv_t1.T1_HOLD={1: 1, 2: 1, 4: 1, 8: 1}'
    done ;;
  gapsdec)  # bench_model's decode step ~3% slower on fp16 x than on fp32 x while every per-kind row ties: one layer's
    # 7 ops in turn (Llama-3-8B's Q4_K_M shapes, 4 copies each from HBM), the kernels and the gaps at each boundary
    ops='q4_K:4096x4096,q4_K:1024x4096,q6_K:1024x4096,q4_K:4096x4096,q4_K:14336x4096,q4_K:14336x4096,q6_K:4096x14336'
    for d in float32 float16; do
      run "gapsdec_$d" 120 python3 bench/probe_op_gaps.py --ops "$ops" --tokens 1 --weights 4 --calls 70 --show 16 \
        --x-dtype "$d"
    done ;;
  t16plan)  # #34's Q8_0 T = 16 on 4096x14336 (t16h 35.0 µs on the H100, 4 warps an SM at kparts 4): the t16h plan
    # at 6 warps (2 tiles, 2 stages) and 8 (1 tile, 2 stages) against 4 (2 tiles, 3 stages), both long and short K
    for s in 4096x14336 14336x4096; do
      run "t16plan_$s" 100 "${AB[@]}" --kernels 'gemv_(q6_k|q8_0)_mma_t16h$' --formats q6_K,q8_0 --shape "$s" \
        --tokens 16 --weights 24 --variant "w6: $t16w6" --variant "w8: $t16w8"
    done ;;
  kpr)  # the kparts parameter of the one-token codec GEMVs (ops.codec_gemv_k_parts, rule codec_gemv_t1_max_ctas:
    # Q4_K / Q6_K 256) against kparts 1 (the builds before), Q8_0 at 256 too (untimed), graph over 64 weights
    for s in 1024x4096 512x3584 2048x4096; do
      for d in float32 float16; do
        run "kpr_${s}_$d" 100 "${AB[@]}" --kernels 'gemv_q4_k_f32_t1$' --formats q4_K,q6_K,q8_0 --shape "$s" --tokens 1 --weights 64 \
          --x-dtype "$d" --variant 'kp1: rule.codec_gemv_t1_max_ctas={}' \
          --variant 'q8: rule.codec_gemv_t1_max_ctas={"q4_K": 256, "q6_K": 256, "q8_0": 256}'
      done
    done
    run kpr_gpu_tests 150 python3 -m pytest -q -x -p no:cacheprovider -m gpu -n 8 tests/test_gpu_emu_crosscheck.py \
      tests/test_gpu_gemv.py -k 'f32_t1 or small or codec or sixteen or t16' ;;
  q5small)  # bench_model --format q5_K's attn_k / attn_v (1024x4096 T = 1: 5.3 µs an op on prep + int8 GEMV, H100; Q4_K's
    # small ops run gemv_q4_k_f32_t1 at kparts 4 in 3.3): Q5_K on its one-token codec GEMV at kparts 1 and by the rule
    s5='rule.codec_few_t1_min_weights={"q6_K": 16777216, "q8_0": 16777216, "q5_K": 16777216}'
    for s in 1024x4096 512x3584 2048x4096; do
      run "q5small_$s" 100 "${AB[@]}" --kernels 'gemv_q5_k_f32_t1$' --formats q5_K --shape "$s" --tokens 1 --weights 64 \
        --variant "f32: $s5" --variant "f32kp: $s5; rule.codec_gemv_t1_max_ctas={\"q4_K\": 256, \"q6_K\": 256, \"q8_0\": 256, \"q5_K\": 256}"
    done ;;
  xtsmall)  # bench_model --format tq4_1s's attn_k / attn_v (512x3584 T = 1: 4.8 µs an op on prep_tq4_1s + the TMA GEMV,
    # H100): the product-table GEMV gemv_tq4_1s_xt_t1 (x unrotated, one launch) under rule xtab_max_tokens
    for s in 512x3584 3584x3584 18944x3584; do
      run "xtsmall_$s" 100 "${AB[@]}" --kernels 'gemv_tq4_1s_xt_t1$' --formats tq4_1s --shape "$s" --tokens 1 --weights 64 \
        --variant 'xt: rule.xtab_max_tokens={"tq4_1s": 1}'
    done ;;
  fusedg)  # #36's T = 1 (Q4_K 12.3 µs on the H200, ≥ 90% of the floor asked): a graph runs prep + GEMV (two kernel
    # boundaries an op; the one-launch build measured ~1 µs slower in a graph on 2026-12-01, before the holds, int8
    # builds and kparts): the fused builds in the graph loop, every format's int8 one- and two-token builds
    for s in 4096x14336 14336x4096 4096x4096; do
      run "fusedg_$s" 100 "${AB[@]}" --kernels 'gemv_q4_k_i8_t1_fused$' --formats q4_K,q5_K,q6_K,q8_0 --shape "$s" \
        --tokens 1,2 --weights 24 --variant 'fused: knob.PTXGEN_Q4K_FUSED=on'
    done ;;
  tq4fused)  # bench_model --format tq4_1s's attn_k / attn_v (512x3584 T = 1: 4.8 µs an op in a graph on prep_tq4_1s + the
    # TMA GEMV, H100; the product-table GEMV lost there, 2026-12-06): mul_mat(rotation="fused") (gemv_tq4_1s_t*: the
    # rotation inside the GEMV, one launch) against the default, eager and graph
    for s in 512x3584 3584x3584 18944x3584; do
      for rot in separate fused; do
        run "tq4fused_${s}_$rot" 100 python3 bench/bench_op.py --formats tq4_1s --shape "$s" --tokens 1,2,4 \
          --no-decode-loop --reps 10 --rotation "$rot"
      done
    done ;;
  cs)  # the cluster split-K register-A GEMMs (shipped 2026-12-06 on an H100: 4096x4096 -11%; 1024x4096's 32 clusters
    # of 4 did not fit there) against the split builds, then the prefill step both ways
    for s in 1024x4096 4096x4096; do
      run "cs_ab_$s" 60 "${AB[@]}" --kernels 'mmq_q[46]_k_wgmma_ra_n(128|256)_cs$' --formats q4_K,q6_K --shape "$s" \
        --tokens 512 --weights 16 --variant 'cs: rule.mmq_cluster_split_max_splits=4'
    done
    for r in 4 0; do run "cs_model_$r" 70 python3 bench/bench_model.py --prefill-only --rule "mmq_cluster_split_max_splits=$r"; done ;;
  cs64)  # 1024x4096 at T = 512 (attn_k / attn_v, 0.53-0.58x cuBLAS): 32 clusters of 4 n128 splits do not fit an H100,
    # 64 clusters of 2 n64 splits do: n64's split build and its cluster build (mmq_q[46]_k_wgmma_ra_n64_cs) against the
    # shipped n128 x 4 split build, then the shipped plan with x converted in the GEMM (the cx builds' rule)
    run cs64_ab 90 "${AB[@]}" --kernels 'mmq_q[46]_k_wgmma_ra_n64_cs$' --formats q4_K,q6_K --shape 1024x4096 \
      --tokens 512 --weights 16 --variant 'n64: rule.wgmma_ra_max_splits=2; rule.mmq_cluster_split_max_splits=0' \
      --variant 'n64cs: rule.wgmma_ra_max_splits=2' \
      --variant 'cx: rule.mmq_cx_min_tokens=512; rule.mmq_cx_max_splits=4'
    run cs64_3584 60 "${AB[@]}" --kernels 'mmq_q4_k_wgmma_ra_n64_cs$' --formats q4_K --shape 3584x3584 --tokens 96,128 \
      --weights 16 --variant 'split: rule.mmq_cluster_split_max_splits=0' ;;
  ncu_smallm)  # the small-M prefill op (Q4_K 1024x4096 T = 512: GEMM 18.4 µs against cuBLAS's 12.6 for the whole op,
    # H100): n128, 32 tiles split 4 ways on 128 CTAs of 168 registers (one an SM), 404 SASS a consumer thread per two
    # K-steps; is it the decode's issue, the pipeline fill of 16-step splits, or the split sums?
    run ncu_smallm_src 150 ncu --kernel-name 'regex:mmq_q4_k_wgmma_ra_n128$' --launch-skip 3 --launch-count 1 \
      --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
      python3 bench/profile_gemv.py q4_K 1024 4096 512 exact
    python3 bench/ncu_source_top.py "$OUT/ncu_smallm_src.log" 40 > "$OUT/ncu_smallm_top.log" 2>&1
    tail -n 44 "$OUT/ncu_smallm_top.log"; rm -f "$OUT/ncu_smallm_src.log"
    run ncu_smallm 90 ncu --kernel-name 'regex:mmq_q4_k_wgmma_ra_n128$' --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis python3 bench/profile_gemv.py q4_K 1024 4096 512 exact ;;
  mid)  # bench_model's attn_q / attn_output (Q4_K 4096x4096 T = 1, 6.7 µs an op on the H100 against a 3.25 floor) on the
    # one-token codec GEMV (one launch, no prep) with kparts 1 / 2 against the shipped prep + int8 GEMV; Q6_K / Q8_0 too
    cap2='rule.codec_gemv_t1_max_ctas={"q4_K": 512, "q6_K": 512, "q8_0": 512}'
    big='rule.codec_gemv_t1_max_weights={"q4_K": 33554432}; rule.codec_few_t1_min_weights={"q6_K": 33554432, "q8_0": 33554432}'
    for s in 4096x4096 4096x3584; do
      run "mid_$s" 100 "${AB[@]}" --kernels 'gemv_q4_k_f32_t1$' --formats q4_K,q6_K,q8_0 --shape "$s" --tokens 1 --weights 32 \
        --variant "f32: $big" --variant "f32kp2: $big; $cap2"
    done ;;
  ncu_t16q8)  # #34's Q8_0 T = 16 on 4096x14336: gemv_q8_0_mma_t16h ran 35.0 µs there (the GEMM's 35.5) but 27.6 on
    # 14336x4096 (H100, 2026-12-06; Q6_K's 32.5 / 32.7): what the long-K shape costs it (4 warps an SM, kparts 4)
    for spec in "4096 14336" "14336 4096"; do
      read -r mm kk <<< "$spec"
      run "ncu_t16q8_${mm}x${kk}" 120 ncu --kernel-name 'regex:gemv_q8_0_mma_t16h$' --launch-skip 3 --launch-count 1 \
        --section WarpStateStats --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
        python3 bench/profile_gemv.py q8_0 "$mm" "$kk" 16 exact
    done ;;
  ncu_i8)  # where the int8 one-token GEMV's issue goes: the graph loop's build (prep_q4k_i8_t1 + gemv_q4_k_i8_t1, knob
    # PTXGEN_Q4K_FUSED=0; the eager one-launch build's profile, 2026-12-06, spent 31% of its samples at its spin)
    run ncu_i8_src 150 ncu --kernel-name 'regex:gemv_q4_k_i8_t1$' --launch-skip 3 --launch-count 1 --section WarpStateStats \
      --section SourceCounters --section SpeedOfLight --section Occupancy --page source --print-source sass --csv \
      python3 bench/profile_gemv.py q4_K 4096 14336 1 exact '{}' PTXGEN_Q4K_FUSED=0
    python3 bench/ncu_source_top.py "$OUT/ncu_i8_src.log" 45 > "$OUT/ncu_i8_top.log" 2>&1; tail -n 50 "$OUT/ncu_i8_top.log"
    run ncu_i8_details 90 ncu --kernel-name 'regex:gemv_q4_k_i8_t1$' --launch-skip 3 --launch-count 1 --section WarpStateStats \
      --section SpeedOfLight --section Occupancy --section LaunchStats python3 bench/profile_gemv.py q4_K 4096 14336 1 exact \
      '{}' PTXGEN_Q4K_FUSED=0 ;;
  ncu_t8)  # #36: where Q4_K's T = 8 GEMV (19.6 µs, 1.59x T = 1; 375 SASS a step at 8 warps an SM) and TQ4_1S's
    # T = 1 lane GEMV (20.1 µs against 14.2) spend their issue slots: source counters, stall reasons, occupancy
    for spec in "gemv_q4_k_mma_t8 q4_K 4096 14336 8" "gemv_tq4_1s_tma_t1 tq4_1s 18944 3584 1"; do
      read -r kn fm mm kk tt <<< "$spec"
      run "ncu_${kn}_src" 150 ncu --kernel-name "regex:$kn\$" --launch-skip 3 --launch-count 1 --section WarpStateStats \
        --section SourceCounters --section SpeedOfLight --section Occupancy --page source --print-source sass --csv \
        python3 bench/profile_gemv.py "$fm" "$mm" "$kk" "$tt" exact
      python3 bench/ncu_source_top.py "$OUT/ncu_${kn}_src.log" 45 > "$OUT/ncu_${kn}_top.log" 2>&1
      tail -n 50 "$OUT/ncu_${kn}_top.log"
    done ;;
  pre)
    for s in 1024x4096 4096x4096; do
      run "pre_$s" 80 "${AB[@]}" --kernels 'mmq_q4_k_wgmma_pre_n256$|dequantize_q4_k_frags' --formats q4_K --shape "$s" --tokens 256,512 \
        --variant 'pre: rule.mmq_pre_min_tokens=256'
    done ;;
  prefill)  # bench_model's prefill step under the candidate rules for #34's last row (1.29x cuBLAS, goal 1.25x)
    run prefill_base 100 python3 bench/bench_model.py --prefill-only
    run prefill_x16 100 python3 bench/bench_model.py --prefill-only --x-dtype float16
    run prefill_cx512 100 python3 bench/bench_model.py --prefill-only --rule mmq_cx_min_tokens=512
    run prefill_sk 100 python3 bench/bench_model.py --prefill-only --rule mmq_stream_k_min_gain=0.05
    run prefill_fuse 100 python3 bench/bench_model.py --prefill-only --fuse ;;
  x16)  # the op as called on fp16 activations against fp32 ones (bench_op's table, one process each)
    for d in float32 float16; do
      run "x16_op_$d" 150 python3 bench/bench_op.py --formats q4_K,q6_K --shape 4096x14336 --tokens 1,4,512 \
        --no-decode-loop --x-dtype "$d"
    done ;;
  x16moe)  # mul_mat_id on fp16 x (the MoE twins) against fp32 x, Q4_K, both shapes, T = 1 / 32 / 512
    for d in float32 float16; do
      run "x16moe_$d" 200 python3 bench/bench_moe.py --tokens 1,32,512 --x-dtype "$d" --reps 10
    done ;;
  x16tq)  # TQ4_1S's decode and prefill on fp16 x (the _x16 preps, rotate_tq4_1s_f16) against fp32 x, eager and graph
    for d in float32 float16; do
      run "x16tq_op_$d" 150 python3 bench/bench_op.py --formats tq4_1s --shape 18944x3584 --tokens 1,4,8,512 \
        --no-decode-loop --x-dtype "$d" --reps 10
    done ;;
  gaps)  # where a prefill op's graph time goes (kernels, gaps) on bench_model's shapes at T = 512
    for fs in q4_K:1024x4096 q6_K:1024x4096 q4_K:4096x4096 q6_K:4096x14336 q4_K:14336x4096; do
      run "gaps_${fs/:/_}" 60 python3 bench/probe_op_gaps.py --fmt "${fs%%:*}" --shape "${fs#*:}" --tokens 512 --calls 20 --show 8
    done ;;
  gaps16)
    for fs in q4_K:1024x4096 q6_K:1024x4096 q4_K:4096x4096 q6_K:4096x14336 q4_K:14336x4096; do
      run "gaps16_${fs/:/_}" 60 python3 bench/probe_op_gaps.py --fmt "${fs%%:*}" --shape "${fs#*:}" --tokens 512 --calls 20 \
        --show 6 --x-dtype float16
    done ;;
  small)
    for s in 1024x4096 4096x4096; do
      run "small_$s" 120 "${AB[@]}" --kernels 'prep_q4k_t1$|gemv_q4_k_f32_t1$' --formats q4_K --shape "$s" --tokens 1 --weights 64 \
        --variant 'one: knob.PTXGEN_Q4K_FUSED=1' --variant 'f32: rule.codec_gemv_t1_max_weights={"q4_K": 67108864}'
    done ;;
  rest)
    run gemv_fast 200 python3 bench/bench_gemv.py --formats q4_K,q5_K --modes fast --rule 'fast_lanes_max_tokens=8'
    run mmq_pre 90 "${AB[@]}" --kernels 'mmq_q4_k_wgmma_pre_n256$' --formats q4_K --shape 1024x4096 --tokens 512 \
      --variant 'pre: rule.mmq_pre_min_tokens=256'
    run mmq_cx 90 "${AB[@]}" --kernels 'mmq_q4_k_wgmma_ra_n256_cx$' --formats q4_K --shape 4096x4096 --tokens 512 \
      --variant 'cx: rule.mmq_cx_min_tokens=512' ;;
  x16model)
    run model_x16_prefill 100 python3 bench/bench_model.py --prefill-only --x-dtype float16
    run model_x16_prefill_fuse 100 python3 bench/bench_model.py --prefill-only --x-dtype float16 --fuse
    run model_x16 150 python3 bench/bench_model.py --x-dtype float16 ;;
  abemit)
    [ -d abold/emitted ] || { echo "queue.sh abemit: no abold/emitted (see the header)"; exit 2; }
    for i in 1 2; do
      run "abemit_old$i" 100 env PTXGEN_EMITTED_DIR="$PWD/abold/emitted" python3 bench/bench_model.py --x-dtype float16
      run "abemit_new$i" 100 python3 bench/bench_model.py --x-dtype float16
    done ;;
  q6nat)
    for s in 128256x4096 4096x14336 1024x4096; do
      for d in float16 float32; do
        run "q6nat_${s}_$d" 100 "${AB[@]}" --kernels 'mmq_q6_k_wgmma_ra_n(64|128|256)(_cx)?$' --formats q6_K --shape "$s" \
          --tokens 512 --weights 2 --x-dtype "$d" --variant 'perm: mmq.RA_NATURAL_FORMATS=("q4_K", "q5_K", "q8_0")'
      done
    done ;;
  perm32)  # #34's prefill on fp32 x (1.28x cuBLAS on the H100, goal 1.25x): fp32 x goes through convert_f16 either way, so
    # the permuted K order (convert_f16_perm, one load a lane) costs no launch more than the natural order's; the
    # natural decode's extra loads (Q4_K 386 -> 405, Q6_K 482 -> 492 SASS an n256 iteration) may: every bench_model
    # shape of Q4_K and Q6_K, the register-A builds (split, cluster, converting) permuted against natural
    for spec in "q6_K 128256x4096 2" "q6_K 4096x14336 8" "q6_K 1024x4096 16" "q4_K 4096x4096 16" "q4_K 14336x4096 8" \
                "q4_K 1024x4096 16"; do
      read -r fm sh nw <<< "$spec"
      nat=$(python3 -c "print(tuple(f for f in ('q4_K', 'q5_K', 'q6_K', 'q8_0') if f != '$fm'))")
      run "perm32_${fm}_$sh" 60 "${AB[@]}" --kernels "mmq_${fm,,}_wgmma_ra_n(64|128|256)(_cx|_cs)?\$" --formats "$fm" \
        --shape "$sh" --tokens 512 --weights "$nw" --variant "perm: mmq.RA_NATURAL_FORMATS=$nat"
    done ;;
  perm8)  # #34's Q8_0 T = 4096 on fp32 x (H200 831 eager, goal 822): its natural-order decode is 272 SASS an n256
    # iteration, the permuted one 252 (two 2-byte loads and a prmt a word against one 4-byte load); fp32 x is
    # converted either way (convert_f16 / _perm, or in the cx build), so the order costs no launch
    nat=$(python3 -c "print(('q4_K', 'q5_K', 'q6_K'))")
    for t in 512 4096; do
      run "perm8_$t" 90 "${AB[@]}" --kernels 'mmq_q8_0_wgmma_ra_n256(_cx)?$' --formats q8_0 --shape 4096x14336 \
        --tokens "$t" --weights 2 --variant "perm: mmq.RA_NATURAL_FORMATS=$nat"
    done ;;
  wide)  # #35 T = 512 on 32 x top-4 (64 pairs an expert: n64 takes a second tile for about half the experts): the
    # 256-row n64 / n80 trial tiles (consumers at 112 registers, whole-block stages) against the shipped n64, then
    # 128 x top-8 at 40-64 pairs an expert; their GPU test first, under a short limit (120 registers hung them)
    run wide_test 90 python3 -m pytest -q -ra -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k wide_trial
    run wide_32x4 200 "${AB[@]}" --kernels 'mmq_q4_k_wgmma_ra_n(64|80)_m256_moe$' --moe 32:4 --shape 1792x2048 \
      --tokens 448,512,576 --weights 8 \
      --variant 'n64w: rule.moe_wgmma_tile_pairs={"n48_m256": 24, "n64_m256": 36, "n128": 128}' \
      --variant 'n80w: rule.moe_wgmma_tile_pairs={"n48_m256": 24, "n64": 36, "n80_m256": 52, "n128": 128}'
    run wide_128x8 150 "${AB[@]}" --kernels 'mmq_q4_k_wgmma_ra_n(64|80)_m256_moe$' --moe 128:8 --shape 768x2048 \
      --tokens 768,1024 --weights 8 \
      --variant 'n80w: rule.moe_wgmma_tile_pairs={"n48_m256": 24, "n80_m256": 40, "n128": 128}' ;;
  gate)  # #35: the gated exact GEMV behind the grouped GEMM (244 registers, one CTA an SM) at grid.y 1 against the
    # shipped 4 (gemv_codec.GATED_EXPERT_CTAS): a closed gate's CTAs in one launch wave (192 / 448 -> 48 / 112)
    run gate_128x8 100 "${AB[@]}" --kernels 'gemv_q4_k_f32_idg$' --moe 128:8 --shape 768x2048 --tokens 32,512 \
      --weights 8 --variant 'g1: gemv_codec.GATED_EXPERT_CTAS=1'
    run gate_32x4 100 "${AB[@]}" --kernels 'gemv_q4_k_f32_idg$' --moe 32:4 --shape 1792x2048 --tokens 32,512 \
      --weights 8 --variant 'g1: gemv_codec.GATED_EXPERT_CTAS=1' ;;
  f16a)  # #34's Q8_0 T = 4096 cell: the f16a GEMM against the register-A and the prepared ones (the rules in R
    # route T >= 1024 to the prepared route; rule mmq_f16a picks the f16a GEMM there); F16A_X=float16 for fp16 x
    run f16a_tests 120 python3 -m pytest -q -ra -p no:cacheprovider -m gpu -n 8 tests/test_gpu_mmq.py -k f16a
    R='rule.mmq_pre_min_tokens=1024; rule.codec_ra_mmq_max_tokens={"q5_K": 512, "q6_K": 512, "q8_0": 512, "tq4_1s": 1073741824}'
    for xd in ${F16A_X:-float32}; do
      run "f16a_$xd" 300 "${AB[@]}" --kernels 'mmq_q4_k_wgmma_f16a_n256' --formats q8_0,q4_K,q5_K,q6_K \
        --tokens 1024,2048,4096 --weights 2 --x-dtype "$xd" --variant "pre: $R" --variant "f16a: $R; rule.mmq_f16a=True"
    done ;;
  power)  # #34's Q8_0 T = 4096 cell is set in a power-limited loop (710 µs isolated, 819 busy in the loop): power draw,
    # SM clock and energy an op for cuBLAS fp16, Q8_0 on fp32 / fp16 x, Q8_0 without its decode, Q4_K
    run power 150 python3 bench/probe_power.py --shape 4096x14336 --tokens 4096 --seconds 1.0 ;;
  gpusub)
    run gpusub 200 python3 -m pytest -q -ra -p no:cacheprovider -m gpu -n 14 tests/test_gpu_moe.py \
      tests/test_gpu_runtime.py tests/test_gpu_streams.py tests/test_gpu_quickstart.py ;;
  q8big)  # #34's Q8_0 T = 4096 cell (H200 831 eager against 822): the shipped converting register-A GEMM against the
    # same GEMM after convert_f16_perm (knob mmq_cx=0) and the prepared-fragments GEMM (knob mmq_pre=1)
    run q8big 120 python3 bench/bench_op.py --formats q8_0 --shape 4096x14336 --tokens 4096 --no-decode-loop --reps 5
    run q8big_nocx 120 python3 bench/bench_op.py --formats q8_0 --shape 4096x14336 --tokens 4096 --no-decode-loop \
      --reps 5 --knob mmq_cx=0
    run q8big_pre 120 python3 bench/bench_op.py --formats q8_0 --shape 4096x14336 --tokens 4096 --no-decode-loop \
      --reps 5 --knob mmq_pre=1 ;;
  tiny)  # 2026-12-07: tokens too small for fp16 recomputed exactly (kernels/convert_f16.py too_small): their GPU tests
    run tiny_tests 150 python3 -m pytest -q -ra -p no:cacheprovider -m gpu -n 4 tests/test_gpu_mmq.py \
      tests/test_gpu_moe.py -k "too_small or overflow or convert_f16" ;;
  g8)  # Q6_K's row-group builds (c0b7a01, kernels/mmq.py ROW_GROUP_NOTE). First the MoE build on row groups (rule
    # moe_row_groups, off): its GPU test, then against the mma.sync grouped GEMM on Qwen3-30B-A3B's ffn_down_exps (128
    # experts, top-8, 2048 x 768); then memcheck on the sweep's calls that run the dense and grouped _g8 builds
    # (racecheck / synccheck ran clean on the dense ones), bench_op on Qwen2.5-7B's Q6_K shapes (K = 3584 / 18944),
    # cuBLAS beside, and Qwen's Q4_K_M prefill
    run g8_moe_tests 150 python3 -m pytest -q -ra -p no:cacheprovider -m gpu -n 4 tests/test_gpu_moe.py -k short_rows
    run g8_moe_ab 200 "${AB[@]}" --kernels '_g8_moe$' --moe 128:8 --shape 2048x768 --formats q6_K --tokens 32,128,512 \
      --variant 'g8: rule.moe_row_groups=True'
    ks=$(printf 'mmq_q6_k_wgmma_ra_n%s_g8%s,' 64 "" 128 "" 256 "" 64 _cs 128 _cs 256 _cs 32 _moe 64 _moe 128 _moe)
    run g8_memcheck 240 compute-sanitizer --tool memcheck --print-limit 20 python3 bench/sanitize.py --only "${ks%,}"
    for sh in 18944x3584 3584x18944; do
      run "g8_op_$sh" 120 python3 bench/bench_op.py --formats q6_K --shape "$sh" --tokens 17,128,512 --no-decode-loop --reps 5
    done
    run g8_model 200 python3 bench/bench_model.py --model qwen2.5-7b --prefill-only ;;  # Qwen's Q4_K_M mix
  minlo)  # mmq.RA_MIN_LO_MMA (2026-12-07, off): -48 of 542 SASS a block in mmq_q4_k_wgmma_ra_n48_m256_moe, the GEMM
    # closer to float64; predicted 4-8% of the GEMM after the gather (128 x top-8 T = 512: 75.6 -> 70.5-73 on the H200)
    ks='mmq_q4_k_wgmma_ra_n(32|48|64|48_m256|80_m256)_moe$'
    run minlo_128 150 "${AB[@]}" --kernels "$ks" --moe 128:8 --shape 768x2048 --tokens 128,512 \
      --variant 'minlo: mmq.RA_MIN_LO_MMA=True'
    run minlo_32 150 "${AB[@]}" --kernels "$ks" --moe 32:4 --shape 1792x2048 --tokens 128,512 \
      --variant 'minlo: mmq.RA_MIN_LO_MMA=True' ;;
  mlship)  # mmq.RA_MIN_LO_MMA shipped (2026-12-07): the grouped register-A Q4_K / Q5_K builds and moe_gather_sums under
    # memcheck / racecheck / synccheck (the sweep's calls that run them), then their GPU tests
    ks=moe_gather_sums,moe_gather_sums_x16,mmq_q4_k_wgmma_ra_n32_moe,mmq_q4_k_wgmma_ra_n48_moe,mmq_q4_k_wgmma_ra_n64_moe
    ks=$ks,mmq_q4_k_wgmma_ra_n48_m256_moe,mmq_q4_k_wgmma_ra_n80_m256_moe,mmq_q5_k_wgmma_ra_n32_moe,mmq_q5_k_wgmma_ra_n64_moe
    run mlship_plain 100 python3 bench/sanitize.py --only "$ks"
    for tool in memcheck racecheck synccheck; do
      run "mlship_$tool" 100 compute-sanitizer --tool "$tool" --print-limit 20 python3 bench/sanitize.py --only "$ks"
    done
    run mlship_tests 150 python3 -m pytest -q -ra -p no:cacheprovider -m gpu -n 8 tests/test_gpu_moe.py ;;
  mlbench)  # bench_moe's #35 rows at HEAD (after mlship)
    run mlbench 200 python3 bench/bench_moe.py --tokens 1,32,64,128,512 --reps 10 ;;
  ncu_moe)  # where the grouped register-A GEMM's warps stall at T = 512 (issue 0.50 a scheduler, DRAM 39%, 1.08 of 4.2
    # warps eligible: ncu_moe_n48_t512_92ad9dd.txt): source counters of n48_m256 (128 x top-8) and n80_m256 (32 x top-4)
    for kn in n48_m256 n80_m256; do
      run "ncu_moe_${kn}_src" 150 ncu --kernel-name "regex:mmq_q4_k_wgmma_ra_${kn}_moe\$" --launch-skip 2 --launch-count 1 \
        --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
        python3 bench/probe_moe_kernels.py --formats q4_K --tokens 512 --reps 3
      python3 bench/ncu_source_top.py "$OUT/ncu_moe_${kn}_src.log" 40 > "$OUT/ncu_moe_${kn}_top.log" 2>&1
      tail -n 44 "$OUT/ncu_moe_${kn}_top.log"; rm -f "$OUT/ncu_moe_${kn}_src.log"
    done ;;
  skel)  # where the shipped 256-row MoE tiles' T = 512 goes (mmq.GROUPED_SKELETON on n48_m256 / n80_m256; the
    # 2026-12-04 table was of the 128-row n48 / n64 tiles: the copies-free op alone was 26-27 µs of 75-81). Same
    # columns as then, plus the step-TMA B path the skeletons fall back to (GROUPED_B_3D off) as their own baseline
    ks='mmq_q4_k_wgmma_ra_n(48|80)_m256_moe$'
    sk=(--variant 'step: mmq.GROUPED_B_3D=False' --variant 'nodecode: mmq.GROUPED_SKELETON="nodecode"'
        --variant 'skeleton: mmq.GROUPED_SKELETON="skeleton"' --variant 'noa: mmq.GROUPED_SKELETON="skeleton_noa"'
        --variant 'nob: mmq.GROUPED_SKELETON="skeleton_nob"' --variant 'neither: mmq.GROUPED_SKELETON="skeleton_noa_nob"')
    run skel_32 200 "${AB[@]}" --kernels "$ks" --moe 32:4 --shape 1792x2048 --tokens 512 "${sk[@]}"
    run skel_trace_32 60 python3 bench/probe_moe_trace.py --moe 32:4 --shape 1792x2048 --tokens 512
    run skel_128 200 "${AB[@]}" --kernels "$ks" --moe 128:8 --shape 768x2048 --tokens 512 "${sk[@]}"
    run skel_trace_128 60 python3 bench/probe_moe_trace.py --moe 128:8 --shape 768x2048 --tokens 512 ;;
  gflag)  # convert_f16.conversion_flag (2026-12-07): the tier, then eager / graph µs of the conversions' prefill routes
    [ -d abold/emitted/sm_90a ] || { echo "queue.sh gflag: no abold/emitted (see the header)"; exit 2; }
    run gflag_tier 330 python3 -m pytest -q -ra -p no:cacheprovider -m gpu -n 14 --dist load
    for i in 1 2; do
      run "gflag_old$i" 60 env PTXGEN_EMITTED_DIR="$PWD/abold/emitted" python3 bench/bench_op.py --formats q4_K,q5_K,q8_0 \
        --shape 4096x14336 --tokens 512,4096 --no-decode-loop --reps 10
      run "gflag_new$i" 60 python3 bench/bench_op.py --formats q4_K,q5_K,q8_0 --shape 4096x14336 --tokens 512,4096 \
        --no-decode-loop --reps 10
    done ;;
  moecheck)  # the kernels changed on 2026-12-06 (quad-transposed stores, the shipped n80_m256 MoE tile) under
    # memcheck / racecheck / synccheck (the sweep's calls that run them), then bench_moe's #35 rows
    ks=mmq_q4_k_wgmma_ra_n80_m256_moe,moe_gather,moe_gather_sums,moe_gather_x16,moe_gather_sums_x16,convert_f16_perm,permute_f16
    ks=$ks,mmq_q6_k_wgmma_ra_n32_g8_moe,mmq_q6_k_wgmma_ra_n64_g8_moe,mmq_q6_k_wgmma_ra_n128_g8_moe,rotate_tq4_1s_f16
    ks=$ks,mul_mat_fixup_q6_k,mmq_q8_0_wgmma_ra_n256_cx  # (2026-12-07: the MoE row groups shipped, the tiny-x flag)
    run moecheck_plain 100 python3 bench/sanitize.py --only "$ks"
    for tool in memcheck racecheck synccheck; do
      run "moecheck_$tool" 100 compute-sanitizer --tool "$tool" --print-limit 20 python3 bench/sanitize.py --only "$ks"
    done
    run moecheck_bench 200 python3 bench/bench_moe.py --tokens 1,32,64,128,512 --reps 10 ;;
  sweep)
    run sweep 200 python3 bench/sanitize.py ;;
  capfree)
    run capfree_review 120 python3 bench/results/review_probe_relaxed_free_59c05ad.py
    run capfree_probe 60 python3 bench/probe_capture_free.py
    run capfree_tests 120 python3 -m pytest -q -ra -p no:cacheprovider -m gpu tests/test_gpu_streams.py -k "capture or dropped" ;;
  sanitize)
    run sanitize 570 env PLAIN_TIMEOUT=150 SANITIZE_TIMEOUT=100 bash bench/sanitize.sh ;;
  moel1)  # #35: mul_mat_id without the gated exact GEMV behind its GEMM (gemv_codec.GATED_EXPERT_CTAS=0: timing only)
    # against the shipped plan, both shapes, T = 32 / 512 — the ceiling of moving the gate into the GEMM (L1)
    run moel1_128 150 "${AB[@]}" --kernels 'gemv_q4_k_f32_idg$' --moe 128:8 --shape 768x2048 --tokens 32,512 \
      --weights 8 --variant 'nogate: gemv_codec.GATED_EXPERT_CTAS=0'
    run moel1_32 150 "${AB[@]}" --kernels 'gemv_q4_k_f32_idg$' --moe 32:4 --shape 1792x2048 --tokens 32,512 \
      --weights 8 --variant 'nogate: gemv_codec.GATED_EXPERT_CTAS=0' ;;
  *) echo "queue.sh: no step $step (f16a power moel1 tier sk model i34 t16c i8q8 xt ncu_xt xrot fixup tq4rot tq4few t8 tq4shared i8 ncu_i8 ncu_t8 pre prefill x16 x16moe x16tq x16model gaps gaps16 small rest sanitize sweep capfree perm8 wide gate q8big moecheck abemit q6nat gpusub gflag minlo mlship mlbench ncu_moe i34q8)"; exit 2 ;;
  esac
done
