#!/usr/bin/env bash
# The largest micro-batch (at --seq-length 2048) and the largest sequence (at micro-batch 1) of the
# 1.3B reference model (configs/gpt-1.3b.json, bf16) that fit on one GPU, without recomputation and
# with each recomputation setting. A size "fits" when two training iterations complete; it does
# not when the run ends with fp8tron's "out of GPU memory" line. The search doubles from a size
# known to fit until one does not, then bisects between the last two (so it names the largest
# size that fits, on the bisection's grid).
# Prints one markdown table. Usage: scripts/bench_max_fit.sh
# (BENCH_OUT: where the logs go; FIT_SETTINGS: the settings to search, default none,
# selective_core_attn_mlp and full_uniform1 — the others are selective_core_attn and full_block12;
# FIT_MBS_STEP / FIT_SEQ_STEP: the bisection's grid, default 2 and 4096; FIT_FLAGS: flags added to
# every run, e.g. "--fp8-format hybrid --fp8-transposes recast" for FP8 at bf16's memory)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source .setup/env.sh
OUT=${BENCH_OUT:-bench-logs}
mkdir -p "$OUT"

declare -A SETTING=(
  [none]=""
  [selective_core_attn]="--recompute-activations"
  [selective_core_attn_mlp]="--recompute-granularity selective --recompute-modules core_attn mlp"
  [full_block12]="--recompute-granularity full --recompute-method block --recompute-num-layers 12"
  [full_uniform1]="--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
)
ORDER=(${FIT_SETTINGS:-none selective_core_attn_mlp full_uniform1})

# fits <log> <flags...>: 0 fits, 1 out of memory, 2 failed for another reason (the log says why).
fits() {
  local log=$1; shift
  # shellcheck disable=SC2086
  # (--lr-decay-iters: the config's warmup must stay shorter than the decay span of two iterations.)
  timeout 180 ./build/fp8tron --config configs/gpt-1.3b.json --train-iters 2 --lr-decay-iters 50 --log-interval 1 \
    ${FIT_FLAGS:-} "$@" >"$log" 2>&1
  grep -q " iteration  *2/" "$log" && return 0
  grep -q "out of GPU memory" "$log" && return 1
  return 2
}

# largest <name> <what: mbs|seq> <start> <extra flags...>: prints the largest size that fits.
largest() {
  local name=$1 what=$2 size=$3; shift 3
  local good=0 bad=0 rc
  local extra=("$@")
  try() {  # try <size>
    local s=$1 flags
    if [ "$what" = mbs ]; then flags=(--micro-batch-size "$s" --global-batch-size "$s")
    else flags=(--micro-batch-size 1 --global-batch-size 1 --seq-length "$s" --max-position-embeddings "$s"); fi
    fits "$OUT/max-fit-$name-$what-$s.log" "${flags[@]}" ${extra[@]+"${extra[@]}"}
  }
  while :; do  # doubling
    try "$size"; rc=$?
    [ $rc -eq 2 ] && { echo "failed at $what $size: $(grep -m1 -iE 'error' "$OUT/max-fit-$name-$what-$size.log" | cut -c1-100)"; return; }
    [ $rc -eq 1 ] && { bad=$size; break; }
    good=$size; size=$((size * 2))
    [ "$size" -gt $([ "$what" = mbs ] && echo 512 || echo 262144) ] && { echo "$good (search limit)"; return; }
  done
  local step=$([ "$what" = mbs ] && echo "${FIT_MBS_STEP:-2}" || echo "${FIT_SEQ_STEP:-4096}")
  while [ $((bad - good)) -gt "$step" ]; do  # bisection on the grid of `step`
    local mid=$(( (good + bad) / 2 / step * step ))
    [ "$mid" -le "$good" ] && break
    try "$mid"; rc=$?
    [ $rc -eq 2 ] && { echo "failed at $what $mid"; return; }
    if [ $rc -eq 0 ]; then good=$mid; else bad=$mid; fi
  done
  if [ "$good" -eq 0 ]; then echo "none (the smallest tried, $bad, does not fit)"; else echo "$good (not $bad)"; fi
}

echo "| recomputation (1 GPU, 1.3B ${FIT_FLAGS:-bf16}) | flags | largest micro-batch at seq 2048 | largest sequence at micro-batch 1 |"
echo "| --- | --- | --- | --- |"
for name in "${ORDER[@]}"; do
  read -r -a flags <<<"${SETTING[$name]}"
  mbs=$(largest "$name" mbs 4 "${flags[@]}")
  seq=$(largest "$name" seq 8192 "${flags[@]}")
  echo "| $name | ${SETTING[$name]:-(none)} | $mbs | $seq |"
done
