#!/bin/bash
# One device call: GPU tests, then benchmarks.  Logs and results land in $OUT (at most 8 files).
#   source .device/setup.sh && bash profiles/gpu_session.sh [tests|bench|all] [pytest -k expr]
set -o pipefail
what=${1:-all}; targets=${2:-tests}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export CUTE_KERNELS_CACHE_DIR=/tmp/ck-cache
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
{ echo "commit $commit (+ uncommitted changes: $(git status --porcelain 2>/dev/null | wc -l) files)"; date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv; } > "$OUT/session.log"
if [[ $what == tests || $what == all ]]; then
  timeout 420 python3 -m pytest -q -m gpu --maxfail=20 -p no:cacheprovider $targets 2>&1 | tail -n 80 | tee "$OUT/gpu-tests.log"
fi
if [[ $what == bench || $what == all ]]; then
  timeout 420 python3 profiles/bench_gemm.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/bench-gemm.log"
fi
if [[ $what == host || $what == all ]]; then
  timeout 200 python3 profiles/bench_host.py 2>&1 | tee "$OUT/bench-host.log"
fi
