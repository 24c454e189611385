#!/usr/bin/env bash
# Starts a multi-process program over NCCL on the GPUs of this machine, with more ranks than GPUs
# when needed: ranks then share a GPU (rank r takes GPU local_rank % GPUs).
#
#   launch.sh <mpirun|torchrun> <ranks> <program> [args...]
#
# NCCL refuses two ranks of one communicator on one GPU of one host. A rank that shares its GPU is
# therefore given a host identity of its own (NCCL_HOSTID=host<rank>): NCCL then takes the ranks for
# separate machines and connects them over its network (socket) transport on loopback. That is slow
# but runs every NCCL code path on real CUDA, including the inter-node one. With one rank per GPU
# nothing is changed and NCCL uses NVLink / P2P as usual.
#
# Exits 77 (ctest's "skipped") on a machine without a GPU. NVLink multicast stays off.
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 <mpirun|torchrun> <ranks> <program> [args...]" >&2
  exit 2
fi
launcher=$1 ranks=$2
shift 2
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 1 ]; then
  echo "skipped: no GPU on this machine (NCCL tests need at least one)"
  exit 77
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Ranks sharing a GPU: one host identity per rank, sockets on loopback.
export FP8TRON_SHARE_GPUS=$((ranks > gpus ? 1 : 0))
if [ "$FP8TRON_SHARE_GPUS" = 1 ]; then
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
fi
# Each rank sets its host identity from the launcher's rank variable, then becomes the program.
per_rank='if [ "$FP8TRON_SHARE_GPUS" = 1 ]; then export NCCL_HOSTID=host${OMPI_COMM_WORLD_RANK:-${RANK:-0}}; fi; exec "$0" "$@"'
case $launcher in
  mpirun)
    forward=()
    for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS OMP_NUM_THREADS FP8TRON_SHARE_GPUS \
             NCCL_SOCKET_IFNAME NCCL_DEBUG LD_LIBRARY_PATH; do
      [ -n "${!v:-}" ] && forward+=(-x "$v")
    done
    exec mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" "${forward[@]}" bash -c "$per_rank" "$@" ;;
  torchrun)
    # torchrun from the Python that has torch (scripts/setup.sh records it); a port of its own per
    # job so that tests can run side by side, below the ephemeral range that NCCL's sockets take.
    py=${FP8TRON_PYTHON:-python3}
    port=$(( 10000 + (RANDOM % 20000) ))
    exec "$py" -m torch.distributed.run --nproc-per-node "$ranks" --master-port "$port" --no-python \
      bash -c "$per_rank" "$@" ;;
  *)
    echo "$0: unknown launcher '$launcher' (mpirun or torchrun)" >&2
    exit 2 ;;
esac
