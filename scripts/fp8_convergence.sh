#!/usr/bin/env bash
# FP8 convergence check: GPT-2 124M on the built-in dataset, 500 steps, bf16 and each
# FP8 recipe from the same seed; prints the final loss (mean of the last 50 iterations) of each and
# its difference from bf16 (target: within 2%). Logs go to $BENCH_OUT (default bench-logs/).
# Usage: scripts/fp8_convergence.sh [iterations] [-- extra flags for every run]
# CONVERGENCE_CONFIG (default configs/gpt2-124m.json; e.g. configs/mixtral-style.json for the MoE
# check) and CONVERGENCE_RECIPES (default every recipe; e.g. "bf16;delayed hybrid") pick the runs;
# words after a recipe's format are flags of that run alone, e.g.
# "delayed hybrid --fp8-dot-product-attention".
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source .setup/env.sh
OUT=${BENCH_OUT:-bench-logs}
mkdir -p "$OUT"
ITERS=500
if [ $# -gt 0 ] && [ "$1" != "--" ]; then ITERS=$1; shift; fi
[ "${1:-}" = "--" ] && shift
extra=("$@")
CONFIG=${CONVERGENCE_CONFIG:-configs/gpt2-124m.json}
IFS=';' read -r -a recipes <<<"${CONVERGENCE_RECIPES:-bf16;delayed hybrid;tensorwise hybrid;blockwise e4m3;mxfp8 hybrid;tensorwise hif8}"
tag=$(basename "$CONFIG" .json)
echo "| recipe | format | final loss (last 50 its) | vs bf16 | tokens/s |"
echo "| --- | --- | --- | --- | --- |"
baseline=""
failed=0
for r in "${recipes[@]}"; do
  set -- $r
  flags=()
  [ "$1" != bf16 ] && flags=(--fp8-recipe "$1" --fp8-format "$2" "${@:3}")
  suffix=$(tr -dc 'a-z0-9-' <<<"${*:3}")
  log="$OUT/convergence-$tag-${1}-${2:-bf16}${suffix:+-$suffix}.log"
  ./build/fp8tron --config "$CONFIG" --train-iters "$ITERS" --lr-warmup-iters 50 --log-interval 50 \
    "${flags[@]}" "${extra[@]}" >"$log" 2>&1 || { echo "| $1 | ${2:-} | failed: $(tail -1 "$log") | | |"; failed=1; continue; }
  last=$(grep "] iteration " "$log" | tail -1)
  loss=$(sed -n 's/.*lm loss: \([0-9.E+-]*\).*/\1/p' <<<"$last")
  tps=$(sed -n 's/.*tokens per second: \([0-9.]*\).*/\1/p' <<<"$last")
  [ -z "$baseline" ] && baseline=$loss
  diff=$(python3 -c "print(f'{100*($loss-$baseline)/$baseline:+.2f}%')")
  echo "| $1 | ${2:-} ${*:3} | $loss | $diff | $tps |"
done
exit $failed
