#!/usr/bin/env bash
# Activation recomputation and context parallelism on the 1.3B reference model
# (configs/gpt-1.3b.json, seq 2048), mpirun, one process per GPU. Prints two markdown tables:
#   1. one GPU: throughput and peak memory without recomputation, full (uniform 1, block 12),
#      selective core_attn and core_attn+mlp; the memory column should drop with full
#      recomputation (to a few layer inputs) at about 1/3 more compute;
#   2. GPUS GPUs: data parallel vs context parallel (p2p, a2a, all_gather) at the same global
#      batch, and CP at --seq-length 8192 where DP alone runs out of memory or crawls.
# Usage: scripts/bench_recompute_cp.sh [GPUS] (default: all visible GPUs; table 2 needs >= 2)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source .setup/env.sh
OUT=${BENCH_OUT:-bench-logs}
mkdir -p "$OUT"
N=${1:-$(nvidia-smi -L | wc -l)}
ITERS=${BENCH_ITERS:-10}
run() {  # run <ranks> <name> <flags...>
  local n=$1 name=$2; shift 2
  local log="$OUT/recompute-cp-$name.log"
  timeout 400 mpirun --allow-run-as-root --bind-to none -np "$n" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=8 \
    ./build/fp8tron --config configs/gpt-1.3b.json --train-iters "$ITERS" --log-interval 5 --distributed-timeout-minutes 2 \
    "$@" >"$log" 2>&1 || { echo "| $name | $* | failed: $(grep -m1 -i error "$log" | cut -c1-120) | | |"; return; }
  local last; last=$(grep "] iteration " "$log" | tail -1)
  local tps tfl mem
  tps=$(sed -n 's/.*tokens per second: \([0-9.]*\).*/\1/p' <<<"$last")
  tfl=$(sed -n 's/.*TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<<"$last")
  mem=$(sed -n 's/.*max allocated: \([0-9.]*\).*/\1/p' "$log" | head -1)
  echo "| $name | $* | $tps | $tfl | $mem |"
}
echo "| recomputation (1 GPU, micro-batch 4, global 16) | flags | tokens/s | TFLOP/s/GPU | max allocated MB |"
echo "| --- | --- | --- | --- | --- |"
B=(--micro-batch-size 4 --global-batch-size 16)
run 1 none "${B[@]}"
run 1 full_uniform1 "${B[@]}" --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
run 1 full_block12 "${B[@]}" --recompute-granularity full --recompute-method block --recompute-num-layers 12
run 1 selective_core_attn "${B[@]}" --recompute-activations
run 1 selective_core_attn_mlp "${B[@]}" --recompute-granularity selective --recompute-modules core_attn mlp
run 1 full_uniform1_fp8 "${B[@]}" --fp8-format hybrid --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
run 1 none_fp8 "${B[@]}" --fp8-format hybrid
run 1 micro8_full "${B[@]}" --micro-batch-size 8 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
if [ "$N" -ge 2 ]; then
  echo
  echo "| context parallel ($N GPUs) | flags | tokens/s (job) | TFLOP/s/GPU | max allocated MB (rank 0) |"
  echo "| --- | --- | --- | --- | --- |"
  C=(--micro-batch-size 2 --global-batch-size 32)
  run "$N" dp "${C[@]}"
  run "$N" cp2_p2p "${C[@]}" --context-parallel-size 2
  run "$N" cp2_a2a "${C[@]}" --context-parallel-size 2 --cp-comm-type a2a
  run "$N" cp2_allgather "${C[@]}" --context-parallel-size 2 --cp-comm-type all_gather
  run "$N" cp2_p2p_fp8 "${C[@]}" --context-parallel-size 2 --fp8-format hybrid
  L=(--seq-length 8192 --max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 8)
  run "$N" seq8k_dp "${L[@]}"
  run "$N" seq8k_cp$N "${L[@]}" --context-parallel-size "$N"
  run "$N" seq8k_cp${N}_a2a "${L[@]}" --context-parallel-size "$N" --cp-comm-type a2a
fi
