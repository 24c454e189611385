#!/usr/bin/env bash
# Throughput of the reference models in multi-GPU layouts, launched with mpirun, one process per
# GPU. Prints markdown tables; logs go to $BENCH_OUT.
#  1. the 1.3B model (configs/gpt-1.3b.json) in the data/tensor/pipeline layouts (with the
#     overlapped distributed optimizer and the new overlaps as a second set of rows);
#  2. tensor-parallel communication overlap (docs/overlap.md): the 1.3B model and a wide one where
#     TP matters (configs/wide-8k.json: hidden 8192), TP4+SP and TP2xDP2+SP (TP8 with 8 GPUs), bf16
#     and FP8 (delayed, tensorwise), each without and with --tp-comm-overlap (and one --use-ascend-mc2
#     row), same run otherwise. --timing-log-level 1 makes the trainer report the exposed
#     tensor-parallel communication per step (the time the compute stream waits for TP collectives:
#     tp-comm-exposed); the table shows it, the cut against the same run without overlap, and the
#     speed-up.
# Usage: scripts/bench_parallel.sh [GPUS] [layouts|overlap|all] (default: all visible GPUs, all)
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0): on shared machines it can take GPUs out of service.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source .setup/env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${BENCH_OUT:-bench-logs}
mkdir -p "$OUT"
N=${1:-$(nvidia-smi -L | wc -l)}
WHAT=${2:-all}
ITERS=${BENCH_ITERS:-10}
GBS=${BENCH_GBS:-64}
failed=0  # any failed run makes the script exit non-zero

# launch <log> <config> <flags...>: one training run; false when it failed.
launch() {
  local log=$1 config=$2; shift 2
  timeout 600 mpirun --allow-run-as-root --bind-to none -np "$N" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=8 \
    ./build/fp8tron --config "$config" --train-iters "$ITERS" --log-interval 5 --distributed-timeout-minutes 2 "$@" >"$log" 2>&1
}
last_iteration() { grep "] iteration " "$1" | tail -1; }
tokens_per_second() { sed -n 's/.*tokens per second: \([0-9.]*\).*/\1/p' <<<"$(last_iteration "$1")"; }
tflops() { sed -n 's/.*TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<<"$(last_iteration "$1")"; }
# A timer of the last "(min, max) time across ranks" block: its max, ms per iteration.
timer_ms() { grep -E "^ +$2 \.+: \(" "$1" | tail -1 | sed -n 's/.*(\([0-9.]*\), \([0-9.]*\)).*/\2/p'; }

run() {  # run <name> <flags...>: one row of the layout table
  local name=$1; shift
  local log="$OUT/parallel-$name.log"
  launch "$log" configs/gpt-1.3b.json --global-batch-size "$GBS" "$@" ||
    { echo "| $name | $* | failed: $(grep -m1 -i error "$log" | cut -c1-120) | | |"; failed=1; return; }
  local mem; mem=$(sed -n 's/.*max allocated: \([0-9.]*\).*/\1/p' "$log" | head -1)
  echo "| $name | $* | $(tokens_per_second "$log") | $(tflops "$log") | $mem |"
}

layouts() {
  echo "| layout ($N GPUs, global batch $GBS x 2048) | flags | tokens/s (job) | TFLOP/s/GPU | max allocated MB (rank 0) |"
  echo "| --- | --- | --- | --- | --- |"
  local overlapped=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
  if [ "$N" -ge 4 ]; then
    run dp4 --micro-batch-size 4
    run tp2_dp2_sp --micro-batch-size 4 --tensor-model-parallel-size 2 --sequence-parallel
    run tp4_sp --micro-batch-size 4 --tensor-model-parallel-size 4 --sequence-parallel
    run pp2_dp2 --micro-batch-size 4 --pipeline-model-parallel-size 2
    run pp4_interleaved --micro-batch-size 4 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 3
    run dp4_distopt --micro-batch-size 4 --use-distributed-optimizer
    run dp4_overlap --micro-batch-size 4 --overlap-grad-reduce
    run dp4_distopt_overlap --micro-batch-size 4 "${overlapped[@]}"
    # The same layouts with every overlap: the distributed optimizer's, the tensor-parallel one and the
    # pipeline's p2p (interleaved; on by default there, off here to compare).
    run tp2_dp2_sp_all_overlaps --micro-batch-size 4 --tensor-model-parallel-size 2 --sequence-parallel "${overlapped[@]}" --tp-comm-overlap
    run tp4_sp_all_overlaps --micro-batch-size 4 --tensor-model-parallel-size 4 --sequence-parallel "${overlapped[@]}" --tp-comm-overlap
    run pp2_dp2_all_overlaps --micro-batch-size 4 --pipeline-model-parallel-size 2 "${overlapped[@]}"
    run pp4_interleaved_no_p2p_overlap --micro-batch-size 4 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 3 --no-overlap-p2p-communication
    run pp4_interleaved_p2p_overlap --micro-batch-size 4 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 3 "${overlapped[@]}"
  else
    run dp2 --micro-batch-size 4
    run tp2_sp --micro-batch-size 4 --tensor-model-parallel-size 2 --sequence-parallel
    run pp2 --micro-batch-size 4 --pipeline-model-parallel-size 2
    run dp2_overlap --micro-batch-size 4 --overlap-grad-reduce
    run dp2_distopt --micro-batch-size 4 --use-distributed-optimizer
    run dp2_distopt_overlap --micro-batch-size 4 "${overlapped[@]}"
    run tp2_sp_tp_comm_overlap --micro-batch-size 4 --tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap
  fi
}

# overlap_pair <model> <layout name> <precision name> <flags...>: the same run without and with the
# overlap (and an MC2 row for bf16), one table row each.
overlap_pair() {
  local model=$1 layout=$2 precision=$3; shift 3
  local config=configs/$model.json base="$OUT/overlap-$model-$layout-$precision"
  local base_tps="" base_exposed=""
  for variant in none tp-comm-overlap use-ascend-mc2; do
    [ "$variant" = use-ascend-mc2 ] && [ "$precision" != bf16 ] && continue
    local log="$base-$variant.log" extra=()
    [ "$variant" != none ] && extra=(--$variant)
    if ! launch "$log" "$config" --timing-log-level 1 "$@" "${extra[@]}"; then
      echo "| $model | $layout | $precision | $variant | failed: $(grep -m1 -i error "$log" | cut -c1-100) | | | | |"
      failed=1
      continue
    fi
    local tps exposed cut speedup
    tps=$(tokens_per_second "$log"); exposed=$(timer_ms "$log" tp-comm-exposed)
    if [ "$variant" = none ]; then base_tps=$tps; base_exposed=$exposed; cut="-"; speedup="1.00"
    else
      cut=$(awk -v a="$base_exposed" -v b="$exposed" 'BEGIN { if (a > 0) printf "%.0f%%", 100 * (a - b) / a; else print "-" }')
      speedup=$(awk -v a="$base_tps" -v b="$tps" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "-" }')
    fi
    echo "| $model | $layout | $precision | $variant | $tps | $(tflops "$log") | $exposed | $cut | ${speedup}x |"
  done
}

overlap_tables() {
  echo
  echo "| model | layout ($N GPUs) | precision | overlap | tokens/s (job) | TFLOP/s/GPU | tp-comm-exposed ms/step (max over ranks) | exposed cut | speed-up |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  local layouts=()
  [ "$N" -ge 2 ] && [ "$N" -lt 4 ] && layouts+=("tp2_sp:--tensor-model-parallel-size 2 --sequence-parallel")
  [ "$N" -ge 4 ] && layouts+=("tp4_sp:--tensor-model-parallel-size 4 --sequence-parallel"
                              "tp2_dp2_sp:--tensor-model-parallel-size 2 --sequence-parallel")
  [ "$N" -ge 8 ] && layouts+=("tp8_sp:--tensor-model-parallel-size 8 --sequence-parallel")
  for model in gpt-1.3b wide-8k; do
    local gbs=$GBS
    [ $model = wide-8k ] && gbs=${BENCH_WIDE_GBS:-16}
    for entry in "${layouts[@]}"; do
      local name=${entry%%:*} flags=${entry#*:}
      # shellcheck disable=SC2086
      overlap_pair $model "$name" bf16 --global-batch-size "$gbs" $flags
      # shellcheck disable=SC2086
      overlap_pair $model "$name" fp8-delayed --global-batch-size "$gbs" $flags --fp8-format hybrid
      # shellcheck disable=SC2086
      overlap_pair $model "$name" fp8-tensorwise --global-batch-size "$gbs" $flags --fp8-format hybrid --fp8-recipe tensorwise
    done
  done
}

case $WHAT in
  layouts) layouts ;;
  overlap) overlap_tables ;;
  all) layouts; overlap_tables ;;
  *) echo "usage: $0 [GPUS] [layouts|overlap|all]" >&2; exit 2 ;;
esac
exit $failed
