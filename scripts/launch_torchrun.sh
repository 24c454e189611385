#!/usr/bin/env bash
# One process per GPU under torchrun (no Python involved: --no-python). Ranks meet through the
# torchrun agent's TCPStore. Usage: scripts/launch_torchrun.sh NPROC_PER_NODE [fp8tron flags...]
# Multi-node: NNODES=2 NODE_RANK=0 MASTER_ADDR=host0 MASTER_PORT=29500 scripts/launch_torchrun.sh 8 ...
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/.setup/env.sh"
N=$1; shift
export NCCL_NVLS_ENABLE=0
exec "$FP8TRON_PYTHON" -m torch.distributed.run --nproc-per-node "$N" --nnodes "${NNODES:-1}" --node-rank "${NODE_RANK:-0}" \
  --master-addr "${MASTER_ADDR:-127.0.0.1}" --master-port "${MASTER_PORT:-29500}" --no-python "$ROOT/build/fp8tron" "$@"
