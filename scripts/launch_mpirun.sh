#!/usr/bin/env bash
# One process per GPU under OpenMPI (NCCL ids go through MPI). On CPU (--device cpu) the ranks
# talk over MPI. Usage: scripts/launch_mpirun.sh NPROC [fp8tron flags...]
#   scripts/launch_mpirun.sh 4 --config configs/gpt-1.3b.json --tensor-model-parallel-size 2 --sequence-parallel
# Multi-node: add `--hostfile hosts` (and make sure every node has the same build).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/.setup/env.sh"
N=$1; shift
export NCCL_NVLS_ENABLE=0  # NVLink multicast off: it can take shared GPUs out of service
exec mpirun --allow-run-as-root --bind-to none -np "$N" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} \
  "$ROOT/build/fp8tron" "$@"
