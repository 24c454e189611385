#!/usr/bin/env bash
# Slurm batch script: one task per GPU; ranks read SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID and meet
# through a TCPStore hosted by rank 0 at MASTER_ADDR:MASTER_PORT.
#   sbatch --nodes 2 --ntasks-per-node 8 --gpus-per-node 8 scripts/launch_slurm.sh --config configs/gpt-1.3b.json ...
#SBATCH --job-name=fp8tron
#SBATCH --exclusive
set -euo pipefail
ROOT=${FP8TRON_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
source "$ROOT/.setup/env.sh"
export MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}
export MASTER_PORT=${MASTER_PORT:-29500}
export NCCL_NVLS_ENABLE=0
exec srun --kill-on-bad-exit=1 "$ROOT/build/fp8tron" "$@"
