#!/usr/bin/env bash
# Throughput benchmarks of the reference models (TARGETS.md) on this machine's GPU(s).
# Prints tokens/s, TFLOP/s/GPU and peak memory per run as a markdown table; full logs go to
# $BENCH_OUT (default bench-logs/). Usage: scripts/bench.sh [gpt2-124m|gpt-1.3b ...] [-- extra flags]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source .setup/env.sh
OUT=${BENCH_OUT:-bench-logs}
mkdir -p "$OUT"
models=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do models+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
extra=("$@")
[ ${#models[@]} -gt 0 ] || models=(gpt2-124m gpt-1.3b)
ITERS=${BENCH_ITERS:-60}

failed=0
echo "| model | flags | tokens/s | TFLOP/s/GPU | ms/iter | max allocated (MB) |"
echo "| --- | --- | --- | --- | --- | --- |"
for m in "${models[@]}"; do
  log="$OUT/$m${BENCH_TAG:+-$BENCH_TAG}.log"
  ./build/fp8tron --config "configs/$m.json" --train-iters "$ITERS" --log-interval $((ITERS < 20 ? ITERS : 20)) --eval-iters 0 "${extra[@]}" >"$log" 2>&1 || {
    echo "| $m | ${extra[*]} | failed: $(tail -1 "$log") | | | |"; failed=1; continue; }
  # The last interval excludes start-up (kernel selection, allocator warm-up).
  last=$(grep " iteration " "$log" | tail -1)
  tps=$(sed -n 's/.*tokens per second: \([0-9.]*\).*/\1/p' <<<"$last")
  tfl=$(sed -n 's/.*TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<<"$last")
  ms=$(sed -n 's/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1/p' <<<"$last")
  mem=$(sed -n 's/.*max allocated: \([0-9.]*\).*/\1/p' "$log" | head -1)
  echo "| $m | ${extra[*]} | $tps | $tfl | $ms | $mem |"
done
exit $failed
