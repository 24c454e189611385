#!/usr/bin/env bash
# One process per GPU under OpenMPI (NCCL ids go through MPI). On CPU (--device cpu) the ranks
# talk over MPI. Usage: scripts/launch_mpirun.sh NPROC [fp8tron flags...]
#   scripts/launch_mpirun.sh 4 --config configs/gpt-1.3b.json --tensor-model-parallel-size 2 --sequence-parallel
# Options for mpirun itself go in MPIRUN_ARGS (everything after NPROC goes to fp8tron), e.g.
# multi-node: MPIRUN_ARGS="--hostfile hosts" scripts/launch_mpirun.sh 16 ... (every node needs the same build).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/.setup/env.sh"
N=$1; shift
export NCCL_NVLS_ENABLE=0  # NVLink multicast off: it can take shared GPUs out of service
exec mpirun --allow-run-as-root --bind-to none ${MPIRUN_ARGS:-} -np "$N" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} \
  "$ROOT/build/fp8tron" "$@"
