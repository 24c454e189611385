#!/usr/bin/env bash
# Where one training step's GPU time goes, fp8tron and the compiled PyTorch reference
# (scripts/reference_gpt.py) side by side: two profiled iterations of each (after warm-up), summed
# by kernel family and by kernel with scripts/profile_summary.py. Summaries (and the traces, unless
# PROFILE_KEEP_TRACES=0) go to $BENCH_OUT (default bench-logs/).
#   scripts/profile_compare.sh [gpt2-124m|gpt-1.3b|llama-style|mixtral-style ...] [-- extra flags for both sides]
# PROFILE_REFERENCE=0 profiles fp8tron only (the reference has no MoE).
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
[ ${#models[@]} -gt 0 ] || models=(gpt2-124m)
tag=${PROFILE_TAG:+-$PROFILE_TAG}
for m in "${models[@]}"; do
  dir="$OUT/profile-$m$tag"
  rm -rf "$dir" && mkdir -p "$dir"
  ./build/fp8tron --config "configs/$m.json" --train-iters 12 --log-interval 4 --eval-iters 0 --profile \
    --use-pytorch-profiler --profile-step-start 8 --profile-step-end 10 --tensorboard-dir "$dir/ours" \
    "${extra[@]}" >"$dir/ours.log" 2>&1 || { echo "fp8tron $m failed: $(tail -1 "$dir/ours.log")"; continue; }
  trace=$(find "$dir/ours" -name '*.pt.trace.json' | head -1)
  echo "## $m ${extra[*]}: fp8tron"
  "$FP8TRON_PYTHON" scripts/profile_summary.py "$trace" --steps 2 --top 30 --by-op --gaps 10 | tee "$dir/ours-summary.md"
  if [ "${PROFILE_REFERENCE:-1}" = 1 ]; then
    "$FP8TRON_PYTHON" scripts/reference_gpt.py --config "configs/$m.json" "${extra[@]}" --iters 5 --warmup 10 \
      --profile-trace "$dir/reference.json" >"$dir/reference.log" 2>&1 ||
      { echo "reference $m failed: $(tail -1 "$dir/reference.log")"; continue; }
    echo "## $m ${extra[*]}: reference (torch.compile)"
    "$FP8TRON_PYTHON" scripts/profile_summary.py "$dir/reference.json" --steps 2 --top 30 --by-op --gaps 10 | tee "$dir/reference-summary.md"
  fi
  [ "${PROFILE_KEEP_TRACES:-1}" = 1 ] || rm -rf "$dir/ours" "$dir/reference.json"
done
