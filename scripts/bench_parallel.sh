#!/usr/bin/env bash
# Throughput of the 1.3B reference model (configs/gpt-1.3b.json) in multi-GPU layouts, launched
# with mpirun, one process per GPU. Prints a markdown table; logs go to $BENCH_OUT.
# Usage: scripts/bench_parallel.sh [GPUS] (default: all visible GPUs)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source .setup/env.sh
OUT=${BENCH_OUT:-bench-logs}
mkdir -p "$OUT"
N=${1:-$(nvidia-smi -L | wc -l)}
ITERS=${BENCH_ITERS:-10}
GBS=${BENCH_GBS:-64}
failed=0
run() {  # run <name> <flags...>
  local name=$1; shift
  local log="$OUT/parallel-$name.log"
  timeout 300 mpirun --allow-run-as-root --bind-to none -np "$N" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=8 \
    ./build/fp8tron --config configs/gpt-1.3b.json --train-iters "$ITERS" --log-interval 5 --global-batch-size "$GBS" \
    --distributed-timeout-minutes 2 "$@" >"$log" 2>&1 || { echo "| $name | $* | failed: $(grep -m1 -i error "$log" | cut -c1-120) | | |"; failed=1; return; }
  local last; last=$(grep " iteration " "$log" | tail -1)
  local tps tfl mem
  tps=$(sed -n 's/.*tokens per second: \([0-9.]*\).*/\1/p' <<<"$last")
  tfl=$(sed -n 's/.*TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<<"$last")
  mem=$(sed -n 's/.*max allocated: \([0-9.]*\).*/\1/p' "$log" | head -1)
  echo "| $name | $* | $tps | $tfl | $mem |"
}
echo "| layout ($N GPUs, global batch $GBS x 2048) | flags | tokens/s (job) | TFLOP/s/GPU | max allocated MB (rank 0) |"
echo "| --- | --- | --- | --- | --- |"
if [ "$N" -ge 4 ]; then
  run dp4 --micro-batch-size 4
  run tp2_dp2_sp --micro-batch-size 4 --tensor-model-parallel-size 2 --sequence-parallel
  run tp4_sp --micro-batch-size 4 --tensor-model-parallel-size 4 --sequence-parallel
  run pp2_dp2 --micro-batch-size 4 --pipeline-model-parallel-size 2
  run pp4_interleaved --micro-batch-size 4 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 3
  run dp4_distopt --micro-batch-size 4 --use-distributed-optimizer
  run dp4_overlap --micro-batch-size 4 --overlap-grad-reduce
  run dp4_distopt_overlap --micro-batch-size 4 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
else
  run dp2 --micro-batch-size 4
  run tp2_sp --micro-batch-size 4 --tensor-model-parallel-size 2 --sequence-parallel
  run pp2 --micro-batch-size 4 --pipeline-model-parallel-size 2
  run dp2_overlap --micro-batch-size 4 --overlap-grad-reduce
  run dp2_distopt --micro-batch-size 4 --use-distributed-optimizer
  run dp2_distopt_overlap --micro-batch-size 4 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
fi
exit $failed
