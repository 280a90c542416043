#!/usr/bin/env bash
# One device call: install ptxgen on the GPU machine, run the GPU tier, then the benchmarks named as
# arguments (default: runtime). Logs and results land in $OUT.
# usage (device tool): bash bench/device.sh [runtime] [gemv] [mmq] ...   (ARGS_<bench>: extra arguments, e.g.
# ARGS_mmq="--tokens 16,32,64" ARGS_gemv="--formats tq4_1s,q4_K")
# PYTEST_ARGS (default "-m gpu -n 12 --dist load": the tier on 12 pytest-xdist workers, which the GPU image has —
# 4.5 min where one process takes over 10; words, no quoting): what pytest runs. The CPU tiers run in CI; on the GPU
# machine they take ~9 minutes of its budget (PYTEST_ARGS=all runs them there too, e.g. against its nvJitLink).
set -uo pipefail
OUT=${OUT:-/tmp/ptxgen-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PTXGEN_CACHE_DIR=/tmp/ptxgen-cache HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import cuda.bindings, numpy, torch; print('cuda-bindings', cuda.bindings.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
if [ "${PYTEST_ARGS:-}" = all ]; then args=(-m "not slow"); else read -r -a args <<< "${PYTEST_ARGS:--m gpu -n 12 --dist load}"; fi
python3 -m pytest -q -ra -p no:cacheprovider "${args[@]}" 2>&1 | tee "$OUT/pytest.log" | tail -25
benches=${*:-runtime}
for b in $benches; do
  extra_var="ARGS_$b"; read -r -a extra <<< "${!extra_var:-}"  # e.g. ARGS_mmq="--tokens 16,32,64"
  echo "== bench $b ${extra[*]}"
  python3 bench/bench_$b.py --out "$OUT/bench_$b.json" "${extra[@]}" 2>&1 | tee "$OUT/bench_$b.log" | tail -40
done
