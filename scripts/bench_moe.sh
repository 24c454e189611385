#!/usr/bin/env bash
# Throughput of the Mixtral-style MoE model (configs/mixtral-style.json: 16 layers, 8 experts,
# top-2; 4.73 B parameters, 1.41 B active, 8.446 GFLOP/token) in bf16 and FP8. TFLOP/s count the
# active parameters (docs/moe.md). Prints a markdown table; logs go to $BENCH_OUT.
#   scripts/bench_moe.sh           one GPU (fits one H200: ~85 GB of weights, gradients and Adam
#                                  states plus the activations of micro-batch 2)
#   scripts/bench_moe.sh 4         4 GPUs with mpirun: EP4 and EP2 x DP2, both dispatchers, plus
#                                  a timed run (--timing-log-level 2) giving the step's share in
#                                  the token dispatch/combine (forward; the backward mirrors it)
# BENCH_ITERS (default 20), BENCH_GBS (global batch, default 16 per GPU), BENCH_MOE_RUNS (names of the
# runs to do, default all) and extra flags after --.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source .setup/env.sh
OUT=${BENCH_OUT:-bench-logs}
mkdir -p "$OUT"
N=1
if [ $# -gt 0 ] && [ "$1" != "--" ]; then N=$1; shift; fi
[ "${1:-}" = "--" ] && shift
extra=("$@")
ITERS=${BENCH_ITERS:-20}
GBS=${BENCH_GBS:-$((16 * N))}

run() {  # run <name> <flags...>
  local name=$1; shift
  # BENCH_MOE_RUNS="bf16 fp8_delayed ...": only these runs (default: all).
  if [ -n "${BENCH_MOE_RUNS:-}" ] && [[ " $BENCH_MOE_RUNS " != *" $name "* ]]; then return; fi
  local log="$OUT/moe-$name.log"
  local launch=()
  [ "$N" -gt 1 ] && launch=(mpirun --allow-run-as-root --bind-to none -np "$N" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH
                          -x OMP_NUM_THREADS=8)
  timeout 900 "${launch[@]}" ./build/fp8tron --config configs/mixtral-style.json --train-iters "$ITERS" --log-interval 10 \
    --global-batch-size "$GBS" --distributed-timeout-minutes 5 "$@" "${extra[@]}" >"$log" 2>&1 || {
    echo "| $name | $* | failed: $(grep -m1 -i error "$log" | cut -c1-120) | | | |"; return; }
  # The last interval excludes start-up (allocator warm-up, first plans).
  local last; last=$(grep "] iteration " "$log" | tail -1)
  local tps tfl ms mem share=""
  tps=$(sed -n 's/.*tokens per second: \([0-9.]*\).*/\1/p' <<<"$last")
  tfl=$(sed -n 's/.*TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<<"$last")
  ms=$(sed -n 's/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1/p' <<<"$last")
  mem=$(sed -n 's/.*max allocated: \([0-9.]*\).*/\1/p' "$log" | head -1)
  if grep -q "moe-token-dispatch" "$log"; then
    # (min, max) ms per iteration of the last timer report: dispatch + combine over forward-backward.
    local d c fb
    d=$(grep "moe-token-dispatch" "$log" | tail -1 | sed -n 's/.*, \([0-9.]*\))$/\1/p')
    c=$(grep "moe-token-combine" "$log" | tail -1 | sed -n 's/.*, \([0-9.]*\))$/\1/p')
    fb=$(grep " forward-backward " "$log" | tail -1 | sed -n 's/.*, \([0-9.]*\))$/\1/p')
    share=$(awk -v d="$d" -v c="$c" -v f="$fb" 'BEGIN { if (f > 0) printf "%.1f%% (dispatch %.1f + combine %.1f of %.1f ms)", 100 * (d + c) / f, d, c, f }')
  fi
  echo "| $name | $* | $tps | $tfl | $ms | $mem | $share |"
}

echo "| run ($N GPU(s), global batch $GBS x 2048) | flags | tokens/s (job) | TFLOP/s/GPU | ms/iter | max allocated MB (rank 0) | dispatch+combine share |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
FP8=(--fp8-format hybrid --fp8-recipe delayed)
if [ "$N" -eq 1 ]; then
  run bf16
  run fp8_delayed "${FP8[@]}"
  run fp8_delayed_router_padding "${FP8[@]}" --moe-router-padding-for-fp8
  run fp8_tensorwise --fp8-format hybrid --fp8-recipe tensorwise
  run fp8_no_gmm_fp8 "${FP8[@]}" --no-use-gmm-fp8
  run bf16_allgather --moe-token-dispatcher-type allgather
else
  EP=$N
  run "ep${EP}_bf16" --expert-model-parallel-size "$EP"
  run "ep${EP}_fp8" --expert-model-parallel-size "$EP" "${FP8[@]}" --moe-router-padding-for-fp8
  run "ep${EP}_bf16_allgather" --expert-model-parallel-size "$EP" --moe-token-dispatcher-type allgather
  run "ep${EP}_bf16_distopt_overlap" --expert-model-parallel-size "$EP" --use-distributed-optimizer --overlap-grad-reduce \
    --overlap-param-gather
  run "ep${EP}_bf16_timers" --expert-model-parallel-size "$EP" --timing-log-level 2
  if [ "$N" -ge 4 ]; then
    run ep2_dp2_bf16 --expert-model-parallel-size 2
    run ep2_dp2_fp8 --expert-model-parallel-size 2 "${FP8[@]}" --moe-router-padding-for-fp8
    run ep2_dp2_bf16_distopt --expert-model-parallel-size 2 --use-distributed-optimizer
    run ep2_dp2_bf16_timers --expert-model-parallel-size 2 --timing-log-level 2
  fi
fi
