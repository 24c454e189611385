#!/usr/bin/env bash
# Makes checkpoints written by Megatron-LM itself, in the layout of tests/fixtures/megatron_checkpoints
# (its README): Megatron's pretrain_gpt.py trains the small test GPT for 14 iterations, saving at 10;
# each fixture keeps ckpt/ with iteration 10 only, args.txt (the model flags, without the parallel
# layout, so that any layout can load it) and losses.txt (the lm loss Megatron printed at 1-14).
# Needs a GPU and a Megatron-LM checkout whose Python imports (no Transformer Engine needed).
# Usage: scripts/make_megatron_fixtures.sh MEGATRON_LM_DIR OUT_DIR [fixture names...]
# (default: every fixture below; logs in OUT_DIR/logs; FIXTURE_JOBS: how many Megatron runs side by
# side, default 1).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MLM=$(cd "${1:?usage: $0 MEGATRON_LM_DIR OUT_DIR [names...]}" && pwd)
[ -f "$MLM/pretrain_gpt.py" ] || { echo "$MLM has no pretrain_gpt.py: pass a Megatron-LM checkout" >&2; exit 2; }
mkdir -p "${2:?usage: $0 MEGATRON_LM_DIR OUT_DIR [names...]}/logs"
DEST=$(cd "$2" && pwd)
shift 2
WANTED=" $* "
source scripts/megatron_launch.sh
GPT=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64)
MOE=("${GPT[@]}" --num-experts 4 --moe-router-topk 2 --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 0.01
     --swiglu --disable-bias-linear)
fail=0

# fixture <name> <ranks> <layout flags...> -- <model flags...>: started in the background, at most
# FIXTURE_JOBS at a time, each on ports of its own.
jobs_started=0
pids=()
fixture() {
  local name=$1
  [ "$WANTED" != "  " ] && [[ $WANTED != *" $name "* ]] && return
  while [ "$(jobs -rp | wc -l)" -ge "${FIXTURE_JOBS:-1}" ]; do wait -n; done
  jobs_started=$((jobs_started + 1))
  MEGATRON_PORT=$((MEGATRON_PORT + 10 * jobs_started)) make_fixture "$@" &
  pids+=($!)
}
make_fixture() {
  local name=$1 ranks=$2; shift 2
  local layout=()
  while [ "$1" != -- ]; do layout+=("$1"); shift; done; shift
  local dir=$DEST/$name log=$DEST/logs/$name.log
  rm -rf "$dir" && mkdir -p "$dir"
  if ! megatron "$log" "$ranks" "${MEGATRON_COMMON[@]}" "$@" "${layout[@]}" --save "$dir/ckpt" ||
     [ ! -d "$dir/ckpt/iter_0000010" ]; then
    echo "FAIL: $name: Megatron-LM failed ($log)"; tail -5 "$log"; return 1
  fi
  find "$dir/ckpt" -mindepth 1 -maxdepth 1 ! -name iter_0000010 -exec rm -rf {} +
  echo 10 > "$dir/ckpt/latest_checkpointed_iteration.txt"
  echo "$*" > "$dir/args.txt"
  grep -E "iteration +[0-9]+/ +14 .*lm loss" "$log" | sed -E 's/.*(iteration +[0-9]+\/ +14).*(lm loss: [0-9.E+-]+).*/\1 \2/' \
    > "$dir/losses.txt"
  if [ "$(wc -l < "$dir/losses.txt")" != 14 ]; then echo "FAIL: $name: not 14 lm losses in $log"; return 1; fi
  echo "ok: $name ($ranks rank(s) ${layout[*]}): $(du -sh "$dir/ckpt" | cut -f1)"
}

fixture moe_ep2_torch_legacy 2 --expert-model-parallel-size 2 -- "${MOE[@]}" --ckpt-format torch
fixture gpt_dp2_distopt_torch_legacy 2 --use-distributed-optimizer -- "${GPT[@]}" --ckpt-format torch
fixture gpt_bf16_torch_legacy 1 -- "${GPT[@]}" --ckpt-format torch --bf16
# Experts whole on every tensor-parallel rank (--expert-tensor-parallel-size 1, as DeepSeek-V3 runs).
fixture moe_tp2_etp1_ep2_torch_legacy 4 --tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 \
  --expert-tensor-parallel-size 1 -- "${MOE[@]}" --ckpt-format torch
fixture gpt_sgd_torch_dist 1 -- "${GPT[@]}" --ckpt-format torch_dist --optimizer sgd --sgd-momentum 0.9
# Megatron asks for sequence parallelism with tensor-parallel experts; it does not change the files.
fixture moe_tp2_ep2_torch_legacy 4 --tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 -- \
  "${MOE[@]}" --ckpt-format torch
fixture gpt_dp2_distopt_bf16_torch_legacy 2 --use-distributed-optimizer -- "${GPT[@]}" --ckpt-format torch --bf16
fixture gpt_bf16_torch_dist 1 -- "${GPT[@]}" --ckpt-format torch_dist --bf16
fixture gpt_sgd_torch_legacy 1 -- "${GPT[@]}" --ckpt-format torch --optimizer sgd --sgd-momentum 0.9
# Multi-latent attention (DeepSeek-V3's), with its latents' norms: the local layers name them
# q_layernorm and kv_layernorm and keep the input norm a module of its own.
fixture mla_torch_dist 1 -- "${GPT[@]}" --multi-latent-attention --q-lora-rank 32 --kv-lora-rank 32 --qk-head-dim 16 \
  --qk-pos-emb-head-dim 16 --v-head-dim 16 --qk-layernorm --position-embedding-type rope --rope-type rope --no-rope-fusion
# fp16: the main weights beside the fp16 ones, and the dynamic loss scaler's state.
fixture gpt_fp16_torch_legacy 1 -- "${GPT[@]}" --ckpt-format torch --fp16 --initial-loss-scale 4096 --loss-scale-window 4
# The distributed optimizer's state laid out per parameter (fp8tron writes this layout; it reads
# Megatron's own only from this fixture).
fixture gpt_dp2_distopt_fully_reshardable_torch_dist 2 --use-distributed-optimizer --dist-ckpt-optim-fully-reshardable -- \
  "${GPT[@]}" --ckpt-format torch_dist
for pid in "${pids[@]}"; do wait "$pid" || fail=1; done
exit $fail
