#!/usr/bin/env bash
# The compute-sanitizer sweep (#37): bench/sanitize.py once plain (fills the compile cache, checks the results), then
# under memcheck, racecheck, synccheck and initcheck; one log, $OUT/sanitize.log. SANITIZE_TIMEOUT: seconds per tool.
set -uo pipefail
OUT=${OUT:-/tmp/ptxgen-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PTXGEN_CACHE_DIR=${PTXGEN_CACHE_DIR:-/tmp/ptxgen-cache}
log="$OUT/sanitize.log"
{ echo "== $(date -u +%F) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  echo "== plain"; timeout "${PLAIN_TIMEOUT:-300}" python3 bench/sanitize.py
  for tool in memcheck racecheck synccheck initcheck; do
    echo "== $tool"
    timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --print-limit 20 python3 bench/sanitize.py --quick \
      2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|calls,|not reached|WRONG|Error|error" | head -40
    echo "   (exit ${PIPESTATUS[0]})"
  done
} 2>&1 | tee "$log"
