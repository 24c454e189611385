#!/usr/bin/env bash
# Per-rank peak GPU memory of the 1.3B reference model (configs/gpt-1.3b.json, bf16) with the
# distributed optimizer and with each Megatron-FSDP sharding strategy, at each data-parallel size,
# against --dry-run's estimate of the same run. Every rank is its own process and reports its own
# caching-allocator peak ("max allocated" after the second iteration); with fewer GPUs than ranks
# the ranks share the GPUs (tests/parallel/nccl_launch.sh), which changes no rank's own memory.
# Prints one markdown table: the largest of the ranks' peaks, and the estimate's expected peak.
# Usage: scripts/bench_sharded_memory.sh [data-parallel sizes, default "2 4"] [-- extra flags]
# (BENCH_OUT: where the logs go; SHARDED_STRATEGIES: the runs, default
# "distopt no_shard optim optim_grads optim_grads_params")
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source .setup/env.sh
OUT=${BENCH_OUT:-bench-logs}
mkdir -p "$OUT"
sizes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do sizes+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#sizes[@]} -gt 0 ] || sizes=(2 4)
SHAPE=(--config configs/gpt-1.3b.json --micro-batch-size 1 --seq-length 1024 --train-iters 2 --log-interval 2 --lr-warmup-iters 0
       --log-all-ranks "$@")

strategy_flags() {
  case $1 in
    distopt) echo "--use-distributed-optimizer" ;;
    *) echo "--use-megatron-fsdp --data-parallel-sharding-strategy $1" ;;
  esac
}

# The estimate's total, in GiB, for <ranks> <flags...>.
estimate() {
  local ranks=$1; shift
  WORLD_SIZE=$ranks ./build/fp8tron "${SHAPE[@]}" --global-batch-size "$ranks" "$@" --dry-run 2>&1 |
    awk '/^  expected peak /{v=$3; u=$4} END{if (u=="MiB") v/=1024; if (v!="") printf "%.2f", v}'
}

echo "| data-parallel | run | max allocated, largest rank (GiB) | --dry-run expected peak (GiB) |"
echo "|---|---|---|---|"
for ranks in "${sizes[@]}"; do
  for s in ${SHARDED_STRATEGIES:-distopt no_shard optim optim_grads optim_grads_params}; do
    flags=($(strategy_flags "$s"))
    log="$OUT/sharded-memory-dp$ranks-$s.log"
    timeout 300 ./tests/parallel/nccl_launch.sh mpirun "$ranks" ./build/fp8tron "${SHAPE[@]}" --global-batch-size "$ranks" \
      "${flags[@]}" >"$log" 2>&1
    peak=$(grep "(after 2 iterations) memory" "$log" | sed 's/.*max allocated: \([0-9.]*\).*/\1/' |
           sort -g | tail -1 | awk '{if ($1 != "") printf "%.2f", $1 / 1024}')
    echo "| $ranks | $s | ${peak:-failed (see $log)} | $(estimate "$ranks" "${flags[@]}") |"
    # A failed run: its first error lines, the rank that failed first among them.
    [ -n "$peak" ] || grep -m3 -E "fp8tron: (error|internal error)|out of GPU memory|Killed|Signal:|signal [0-9]" "$log" >&2
  done
done
