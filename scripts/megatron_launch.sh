# Sourced by the scripts that run Megatron-LM itself on a GPU machine (megatron_resume_check.sh,
# make_megatron_fixtures.sh): the flags every run of the small test GPT shares, and a launcher of
# Megatron's pretrain_gpt.py with ranks sharing the GPUs when there are fewer GPUs than ranks (each
# is then given its own NCCL host identity and cuda:0). Megatron runs through
# scripts/megatron_without_apex_or_te.py, which fills the gaps of a Megatron-LM installed without
# Apex or Transformer Engine. Expects ROOT (fp8tron's checkout) and MLM (a Megatron-LM checkout).
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo} NCCL_NVLS_ENABLE=0
export CUDA_DEVICE_MAX_CONNECTIONS=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
MEGATRON_COMMON=(--micro-batch-size 2 --global-batch-size 8 --train-iters 14 --lr 1e-3 --min-lr 1e-4
                 --lr-decay-style cosine --lr-warmup-iters 2 --mock-data --tokenizer-type NullTokenizer
                 --vocab-size 1024 --log-interval 1 --eval-iters 0 --eval-interval 1000 --seed 1234
                 --hidden-dropout 0 --attention-dropout 0 --transformer-impl local --no-persist-layer-norm
                 --no-gradient-accumulation-fusion --save-interval 10 --weight-decay 0.1 --clip-grad 1.0)
MEGATRON_PORT=${MEGATRON_PORT:-29400}

# "<iteration> <lm loss>" of every iteration line of a log (fp8tron's or Megatron's).
losses() { sed -nE 's/.*iteration +([0-9]+)\/ +[0-9]+ .*lm loss: ([0-9.E+-]+).*/\1 \2/p' "$1"; }

megatron() {  # megatron <log> <ranks> <flags...>: pretrain_gpt.py, every rank on cuda:0 when sharing
  local log=$1 ranks=$2; shift 2
  MEGATRON_PORT=$((MEGATRON_PORT + 1))
  (cd "$MLM" && torchrun --nproc-per-node "$ranks" --master-port "$MEGATRON_PORT" --no-python bash -c \
     'if [ "$WORLD_SIZE" -gt "$(nvidia-smi -L | grep -c ^GPU)" ]; then export NCCL_HOSTID=host$RANK LOCAL_RANK=0; fi
      exec python3 "$0" pretrain_gpt.py "$@"' "$ROOT/scripts/megatron_without_apex_or_te.py" "$@" \
     --no-masked-softmax-fusion) > "$log" 2>&1
}
