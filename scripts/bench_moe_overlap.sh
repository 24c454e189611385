#!/usr/bin/env bash
# The expert-parallel all-to-all overlap (--overlap-moe-expert-parallel-comm) measured: the
# Mixtral-style model cut to BENCH_LAYERS layers (default 4) at EP = <ranks> (default 2), bf16,
# run without and with the overlap (and any extra runs named in BENCH_MOE_OVERLAP_RUNS). With fewer
# GPUs than ranks the ranks share them (tests/parallel/nccl_launch.sh): NCCL then talks over
# sockets, a slow transport where the all-to-alls dominate the step, which is where the overlap
# has the most to hide. Prints a markdown table from the last timer report of each run:
#   ms/iter, forward-backward (max over ranks; host time: on a GPU the step's tail waits in the
#   optimizer), ep-comm-exposed (the time the GPU waited for all-to-alls that no computation hid,
#   from events) and the share of the exposed time that the overlap hid of what the computation
#   could cover: (exposed without - exposed with) / min(exposed without, compute), compute being
#   the iteration's time minus the exposed time in the run without.
#   scripts/bench_moe_overlap.sh [ranks] [-- extra flags]
# BENCH_ITERS (default 12), BENCH_MICRO_BATCHES (per rank and step, default 4); logs in $BENCH_OUT.
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
GBS=$((MBS * N * ${BENCH_MICRO_BATCHES:-4}))  # every rank is a data-parallel rank of the dense part

source scripts/exposed_comm.sh

declare -A MS EXPOSED
run() {  # run <name> <flags...>
  local name=$1; shift
  local log="$OUT/moe-overlap-$name.log"
  timeout 600 ./tests/parallel/nccl_launch.sh mpirun "$N" ./build/fp8tron --config configs/mixtral-style.json \
    --num-layers "${BENCH_LAYERS:-4}" --seq-length 1024 --micro-batch-size $MBS --global-batch-size $GBS \
    --expert-model-parallel-size "$N" --train-iters "$ITERS" --log-interval $((ITERS / 3)) --timing-log-level 1 \
    --distributed-timeout-minutes 5 "$@" "${extra[@]}" >"$log" 2>&1 || {
    echo "| $name | $* | failed: $(grep -m1 -i error "$log" | cut -c1-120) | | | |"; return; }
  local ms fb
  ms=$(iteration_ms "$log")
  fb=$(last_max "$log" forward-backward)
  MS[$name]=$ms
  EXPOSED[$name]=$(last_max "$log" ep-comm-exposed)
  local hidden=""
  if [ "$name" != plain ] && [ -n "${EXPOSED[plain]:-}" ]; then
    hidden=$(hidden_share "${EXPOSED[plain]}" "${MS[plain]}" "${EXPOSED[$name]}")
  fi
  echo "| $name | $* | $ms | $fb | ${EXPOSED[$name]} | $hidden |"
}

echo "| run (EP$N, $N rank(s) on $(nvidia-smi -L | wc -l) GPU(s), global batch $GBS x 1024) | flags | ms/iter | forward-backward ms | ep-comm-exposed ms | exposed time hidden, of what compute covers |"
echo "| --- | --- | --- | --- | --- | --- |"
run plain
run overlap --overlap-moe-expert-parallel-comm
for r in ${BENCH_MOE_OVERLAP_RUNS:-}; do
  case $r in
    overlap_delay_wgrad) run overlap_delay_wgrad --overlap-moe-expert-parallel-comm --delay-wgrad-compute ;;
    *) echo "bench_moe_overlap.sh: unknown run '$r' (known: overlap_delay_wgrad)" >&2; exit 2 ;;
  esac
done
