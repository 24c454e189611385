#!/usr/bin/env bash
# The data-parallel communication overlap (--overlap-grad-reduce --overlap-param-gather) measured
# for the distributed optimizer and for Megatron-FSDP's ZeRO-3 (--use-megatron-fsdp
# --data-parallel-sharding-strategy optim_grads_params): GPT 1.3B cut to BENCH_LAYERS layers
# (default 4) at DP = <ranks> (default 2), bf16, each engine run without and with the overlap.
# With fewer GPUs than ranks the ranks share them (tests/parallel/nccl_launch.sh): NCCL then talks
# over sockets, a slow transport where the gradient reductions and parameter gathers dominate the
# step, which is where the overlap has the most to hide. Prints a markdown table from the last
# timer report of each run:
#   ms/iter, forward-backward and optimizer (max over ranks; host time: on a GPU the step's tail
#   waits in the optimizer), dp-comm-exposed (the time the GPU waited for the data-parallel
#   groups' operations that no computation hid, from events) and, for a run with the overlap, the
#   share of the exposed time it hid of what the computation could cover against the same engine
#   without it: (exposed without - exposed with) / min(exposed without, compute), compute being the
#   iteration's time minus the exposed time in the run without; and its speed against that run
#   (ms/iter without / with), the figure to read where ranks share a GPU: their contexts take
#   turns on it, so communication the timer no longer sees as exposed can still hold the
#   computation back (a hidden share above 100% says so).
#   scripts/bench_sharded_overlap.sh [ranks] [-- extra flags]
# BENCH_ITERS (default 12), BENCH_MICRO_BATCHES (per rank and step, default 2); logs in $BENCH_OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source .setup/env.sh
OUT=${BENCH_OUT:-bench-logs}
mkdir -p "$OUT"
N=2
if [ $# -gt 0 ] && [ "$1" != "--" ]; then N=$1; shift; fi
[ "${1:-}" = "--" ] && shift
extra=("$@")
ITERS=${BENCH_ITERS:-12}
MBS=2
GBS=$((MBS * N * ${BENCH_MICRO_BATCHES:-2}))
OVERLAP=(--overlap-grad-reduce --overlap-param-gather)
FSDP=(--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params)

source scripts/exposed_comm.sh

declare -A MS EXPOSED
run() {  # run <name> <baseline or -> <flags...>
  local name=$1 base=$2; shift 2
  local log="$OUT/sharded-overlap-$name.log"
  timeout 600 ./tests/parallel/nccl_launch.sh mpirun "$N" ./build/fp8tron --config configs/gpt-1.3b.json \
    --num-layers "${BENCH_LAYERS:-4}" --micro-batch-size $MBS --global-batch-size $GBS --train-iters "$ITERS" \
    --log-interval $((ITERS / 3)) --timing-log-level 1 --distributed-timeout-minutes 5 "$@" "${extra[@]}" \
    >"$log" 2>&1 || {
    echo "| $name | $* | failed: $(grep -m1 -i error "$log" | cut -c1-120) | | | | | |"; return; }
  local ms fb opt
  ms=$(iteration_ms "$log")
  fb=$(last_max "$log" forward-backward)
  opt=$(last_max "$log" optimizer)
  MS[$name]=$ms
  EXPOSED[$name]=$(last_max "$log" dp-comm-exposed)
  local hidden="" speed=""
  if [ "$base" != - ] && [ -n "${EXPOSED[$base]:-}" ] && [ -n "${EXPOSED[$name]}" ]; then
    hidden=$(hidden_share "${EXPOSED[$base]}" "${MS[$base]}" "${EXPOSED[$name]}")
  fi
  if [ "$base" != - ] && [ -n "${MS[$base]:-}" ] && [ -n "$ms" ]; then
    speed=$(awk -v a="${MS[$base]}" -v b="$ms" 'BEGIN { if (b > 0) printf "%.2fx", a / b }')
  fi
  echo "| $name | $* | $ms | $fb | $opt | ${EXPOSED[$name]} | $hidden | $speed |"
}

echo "| run (DP$N, $N rank(s) on $(nvidia-smi -L | wc -l) GPU(s), ${BENCH_LAYERS:-4} layers, global batch $GBS x 2048) | flags | ms/iter | forward-backward ms | optimizer ms | dp-comm-exposed ms | exposed time hidden, of what compute covers | speed against the run without |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
run distopt - --use-distributed-optimizer
run distopt_overlap distopt --use-distributed-optimizer "${OVERLAP[@]}"
run fsdp - "${FSDP[@]}"
run fsdp_overlap fsdp "${FSDP[@]}" "${OVERLAP[@]}"
