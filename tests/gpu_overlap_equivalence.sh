#!/usr/bin/env bash
# GPU test (ctest label gpu): the tensor-parallel overlap under NCCL on the GPUs present, against the
# same layout without it. Needs at least 2 GPUs (exit 77 = skipped otherwise); any mismatch fails.
# bf16 and FP8 (delayed, tensorwise, blockwise) at TP2 with sequence parallelism (TP4 when 4 GPUs are
# there), every overlap on; --use-ascend-mc2 against --tp-comm-overlap. GPU GEMMs pick kernels by
# shape and NCCL's reductions round differently from the ring's fp32 sums, so runs are held to the
# bf16 tolerance (2e-2 relative on losses) instead of bitwise. NVLink multicast stays off.
# Usage: gpu_overlap_equivalence.sh <fp8tron_parallel_equivalence> <source dir>
set -uo pipefail
EQ=$1
SRC=$2
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$GPUS" -lt 2 ]; then echo "skipped: $GPUS GPU(s), the overlap test needs at least 2"; exit 77; fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MPI="timeout 300 mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=4"
CFG=$SRC/tests/overlap
fail=0
run() {  # run <ranks> <flags...>
  local n=$1; shift
  local out; out=$($MPI -np "$n" "$EQ" --device cuda --bf16 --tolerance 2e-2 --without-tolerance 2e-2 "$@" 2>&1)
  local status=$?
  echo "$out" | grep -E "\[rank 0\].*(equivalent|MISMATCH)|rror|differ" | head -5
  if [ $status -ne 0 ] || ! echo "$out" | grep -q "\[rank 0\].*equivalent"; then echo "FAILED: -np $n $*"; fail=1; fi
}
for tp in 2 4; do
  [ "$GPUS" -ge $tp ] || continue
  base=(--tensor-model-parallel-size $tp --sequence-parallel --seq-length 32)
  run $tp "${base[@]}" --tp-comm-overlap --tp-comm-overlap-rs-dgrad --identical-without --tp-comm-overlap \
      --identical-swapped --tp-comm-overlap --use-ascend-mc2
  run $tp "${base[@]}" --tp-comm-overlap --tp-comm-overlap-cfg "$CFG/ring_rs.yaml" --identical-without --tp-comm-overlap
  run $tp "${base[@]}" --use-ascend-coc --coc-parallel-num 2 --identical-without --use-ascend-coc
  run $tp "${base[@]}" --fp8-format hybrid --tp-comm-overlap --tp-comm-overlap-rs-dgrad \
      --tp-comm-overlap-cfg "$CFG/rs_dgrad_splits2.yaml" --identical-without --tp-comm-overlap
  run $tp "${base[@]}" --fp8-format hybrid --fp8-recipe tensorwise --tp-comm-overlap \
      --tp-comm-overlap-cfg "$CFG/splits2.yaml" --identical-without --tp-comm-overlap
  run $tp "${base[@]}" --fp8-format e4m3 --fp8-recipe blockwise --tp-comm-overlap --tp-comm-overlap-cfg "$CFG/ring_rs.yaml" \
      --identical-without --tp-comm-overlap
done
exit $fail
