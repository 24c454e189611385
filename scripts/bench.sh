#!/usr/bin/env bash
# Throughput of the reference models (configs/, docs/performance.md) on this machine, raced in
# the same run against scripts/reference_gpt.py: a PyTorch GPT of the same architecture with
# torch.compile, fused AdamW and bf16 autocast, given the same flags. Prints a markdown table
# (tokens/s of both, their ratio, TFLOP/s/GPU, peak memory of both); full logs go to $BENCH_OUT
# (default bench-logs/).
#   scripts/bench.sh [gpt2-124m|gpt-1.3b|llama-style ...] [-- extra flags for both sides]
# BENCH_ITERS (default 60: the figures are the last interval's), BENCH_REFERENCE=0 skips the
# reference; BENCH_REFERENCE_ITERS (default 20) timed and BENCH_REFERENCE_WARMUP (default 10)
# untimed reference iterations. BENCH_FP8TRON_FLAGS: flags for fp8tron alone (e.g. "--cuda-graph-impl
# full_iteration" raced against the reference in its default compile mode). Flags that only
# fp8tron understands (--fp8-format, ...) are ignored by the reference, which stays bf16 unless
# BENCH_REFERENCE_FLAGS gives it flags of its own: "--torchao-fp8 tensorwise" races torchao's FP8
# (the torchao package must be installed).
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
REFERENCE=${BENCH_REFERENCE:-1}

field() { sed -n "s|.*$1 \([0-9.]*\).*|\1|p" <<<"$2"; }
failed=0
echo "| model | flags | fp8tron tokens/s | reference tokens/s | fp8tron / reference | TFLOP/s/GPU | ms/iter | max allocated MB (fp8tron / reference) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for m in "${models[@]}"; do
  log="$OUT/$m${BENCH_TAG:+-$BENCH_TAG}.log"
  if ! ./build/fp8tron --config "configs/$m.json" --train-iters "$ITERS" --log-interval $((ITERS < 20 ? ITERS : 20)) \
       --eval-iters 0 "${extra[@]}" ${BENCH_FP8TRON_FLAGS:-} >"$log" 2>&1; then
    echo "| $m | ${extra[*]} | failed: $(tail -1 "$log") | | | | | |"; failed=1; continue
  fi
  # The last interval excludes start-up (kernel selection, allocator warm-up).
  last=$(grep "] iteration " "$log" | tail -1)
  tps=$(sed -n 's/.*tokens per second: \([0-9.]*\).*/\1/p' <<<"$last")
  tfl=$(sed -n 's/.*TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<<"$last")
  ms=$(sed -n 's/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1/p' <<<"$last")
  mem=$(sed -n 's/.*max allocated: \([0-9.]*\).*/\1/p' "$log" | head -1)
  ref_tps="-" ratio="-" ref_mem="-"
  if [ "$REFERENCE" = 1 ]; then
    ref_log="$OUT/$m${BENCH_TAG:+-$BENCH_TAG}-reference.log"
    if "$FP8TRON_PYTHON" scripts/reference_gpt.py --config "configs/$m.json" "${extra[@]}" \
         --iters "${BENCH_REFERENCE_ITERS:-20}" --warmup "${BENCH_REFERENCE_WARMUP:-10}" ${BENCH_REFERENCE_FLAGS:-} >"$ref_log" 2>&1; then
      line=$(grep "^reference |" "$ref_log" | tail -1)
      ref_tps=$(field "tokens/s" "$line")
      ref_mem=$(field "max allocated MB" "$line")
      ratio=$(awk -v a="$tps" -v b="$ref_tps" 'BEGIN { printf "%.2fx", a / b }')
    else
      ref_tps="failed: $(tail -1 "$ref_log")"; failed=1
    fi
  fi
  echo "| $m | ${extra[*]}${BENCH_FP8TRON_FLAGS:+ (fp8tron: $BENCH_FP8TRON_FLAGS)}${BENCH_REFERENCE_FLAGS:+ (reference: $BENCH_REFERENCE_FLAGS)} | $tps | $ref_tps | $ratio | $tfl | $ms | $mem / $ref_mem |"
done
exit $failed
