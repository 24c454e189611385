#!/usr/bin/env bash
# MoE expert GEMMs on this machine's GPU (docs/performance.md, "Mixture of experts"): builds
# and runs tests/fp8/bench_grouped_gemm.cpp, which times fp8tron's grouped GEMMs and grouped linear
# side by side with torch._grouped_mm / torch._scaled_grouped_mm (through ATen) on three expert
# shapes, balanced and skewed, eager and CUDA-graph timings; then the same torch calls from
# Python (tests/fp8/bench_grouped_gemm_torch.py, same timing) as a cross-check of the torch rows.
# Output also goes to $BENCH_OUT/grouped-gemm.txt (default bench-logs/). Usage:
#   scripts/bench_grouped_gemm.sh [iterations per timing (default 20)]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source .setup/env.sh
OUT=${BENCH_OUT:-bench-logs}
mkdir -p "$OUT"
ITERS=${1:-20}
./scripts/build.sh fp8tron_bench_grouped_gemm >"$OUT/grouped-gemm-build.log" 2>&1 || { tail -20 "$OUT/grouped-gemm-build.log"; exit 1; }
{
  ./build/tests/fp8/fp8tron_bench_grouped_gemm "$ITERS"
  echo
  PY=${FP8TRON_PYTHON:-python3}
  "$PY" tests/fp8/bench_grouped_gemm_torch.py "$ITERS" || echo "(python torch cross-check failed)"
} 2>&1 | tee "$OUT/grouped-gemm.txt"
