# one device call (2026-12-07): the f16a GEMM's GPU tests, then its A/B against the shipped route at T = 4096
export PTXGEN_CACHE_DIR=/tmp/ptxgen-cache PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
timeout 70 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/test_gpu_mmq.py -k f16a 2>&1 | grep -v Warning | tail -6 | tee $OUT/f16a_tests.log
R='rule.mmq_pre_min_tokens=1024; rule.codec_ra_mmq_max_tokens={"q5_K": 512, "q6_K": 512, "q8_0": 512, "tq4_1s": 1073741824}'
timeout 100 python3 bench/probe_build_ab.py --kernels 'mmq_q4_k_wgmma_f16a_n256' --formats ${F16A_FORMATS:-q8_0,q4_K} --tokens ${F16A_TOKENS:-4096} --weights 2 --variant "f16a: $R; rule.mmq_f16a=True" 2>&1 | tee $OUT/f16a_ab.log | grep -v "^rebuilt\|Warning"
