#!/usr/bin/env bash
# Megatron-LM's multi-token-prediction MoE test configurations train on the CPU, each with its own
# flags and its own parallel layout (8 ranks under mpirun: TP 2 x PP 2 with 4 virtual stages or
# the layout 'Et*3|(tt|)*6tmL', EP 4, ETP 1, the distributed optimizer with overlapped reduction
# and gather, MLA, the MoE routing as configured, an MoE MTP layer, FP8 tensorwise (emulated) in
# the first, selective recomputation of layernorm, mla_up_proj, mlp and moe_act in the second,
# --logging-level 40), only the model shrunk to CPU size by flags appended after the file's
# (later values win): a few iterations, a checkpoint, and a resume from it, as Megatron's
# ckpt-resume test runs them. The second's --overlap-moe-expert-parallel-comm runs the combined
# 1F1B schedule inside the interleaved pipeline its layout makes.
# A fine-grained activation offloading configuration trains shrunk to iteration 2 in its layout.
# The fill-in-the-middle configuration (--fim-data, 8 data-parallel ranks, the distributed
# optimizer, bf16, GPT-2's tokenizer whose vocabulary lacks the FIM tokens, so they are
# "<|endoftext|>" as in Megatron) trains shrunk the same way, and a run stopped at iteration 2 and
# resumed gives the uninterrupted run's losses: each sample's rewrite depends on its index only.
# A configuration for each of the other features added for Megatron's configurations trains shrunk
# to iteration 2 (below).
#
# usage: megatron_configs_train.sh FP8TRON FP8TRON_PREPROCESS MAKE_TEST_DATA SOURCE_DIR MPIRUN [--nccl LAUNCH]
# --nccl: the same runs over NCCL on this machine's GPUs (LAUNCH is tests/parallel/nccl_launch.sh; with fewer
# GPUs than ranks the ranks share them; exit 77 without a GPU).
set -u
BIN=$1 PRE=$2 MAKE=$3 SRC=$4 MPIRUN=$5
NCCL_LAUNCH=""
[ "${6:-}" = --nccl ] && NCCL_LAUNCH=$7
DIR=$SRC/tests/cli/megatron_configs
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$DIR/test_data.sh"

# CPU size: hidden 64, 4 heads of 16, sequences of 64 tokens, 8 experts of 32, MLA ranks 32/16; a
# split that leaves the small test corpus a test set.
SHRINK=(--hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --kv-channels 16 --seq-length 64
        --max-position-embeddings 64 --micro-batch-size 1 --global-batch-size 4 --num-experts 8
        --moe-ffn-hidden-size 32 --moe-shared-expert-intermediate-size 32 --q-lora-rank 32 --kv-lora-rank 16
        --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16 --make-vocab-size-divisible-by 64
        --train-iters 4 --save-interval 2 --eval-interval 2 --eval-iters 1 --log-interval 1 --device cpu
        --distributed-timeout-minutes 5 --split 90,8,2)

# The dense FIM configuration: 2 layers instead of 12, otherwise the same CPU size.
DENSE_SHRINK=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64
              --micro-batch-size 1 --global-batch-size 8 --make-vocab-size-divisible-by 64 --train-iters 4
              --save-interval 2 --eval-interval 2 --eval-iters 1 --log-interval 1 --device cpu
              --distributed-timeout-minutes 5 --split 90,8,2)

# The other dense configurations: their own number of layers (pipeline layouts divide it).
LAYERED_SHRINK=("${DENSE_SHRINK[@]:2}")
# A configuration whose shape the above do not fit sets its own (OWN_SHRINK) for one run.
OWN_SHRINK=()

fail=0
run() {  # run <name> <log> <extra flags...>: the configuration under mpirun with its world size
  local name=$1 log=$2; shift 2
  local f="$DIR/$name.args"
  local ws; ws=$(sed -n 's/^# world-size: \([0-9]*\).*/\1/p' "$f")
  local shrink=("${SHRINK[@]}")
  grep -qx -- '--fim-data' "$f" && shrink=("${DENSE_SHRINK[@]}")
  grep -q -- '^--num-experts' "$f" || grep -qx -- '--fim-data' "$f" || shrink=("${LAYERED_SHRINK[@]}")
  [ ${#OWN_SHRINK[@]} -gt 0 ] && shrink=("${OWN_SHRINK[@]}")
  eval "args=($(grep -v '^#' "$f" | tr '\n' ' '))"
  if [ -n "$NCCL_LAUNCH" ]; then
    "$NCCL_LAUNCH" mpirun "$ws" "$BIN" "${args[@]}" "${shrink[@]}" --device cuda "$@" >"$log" 2>&1
  else
    "$MPIRUN" --allow-run-as-root --oversubscribe --bind-to none -np "$ws" -x OMP_NUM_THREADS=1 \
      "$BIN" "${args[@]}" "${shrink[@]}" "$@" >"$log" 2>&1
  fi
}
if [ -n "$NCCL_LAUNCH" ]; then
  "$NCCL_LAUNCH" mpirun 1 true >/dev/null
  [ $? = 77 ] && { echo "skipped: no GPU on this machine"; exit 77; }
fi
check() {  # check <log> <rc> <text>...: exit status 0 and every text in the log
  local log=$1 rc=$2; shift 2
  local missing=""
  for t in "$@"; do grep -qF -- "$t" "$log" || missing="$missing [$t]"; done
  if [ "$rc" != 0 ] || [ -n "$missing" ]; then
    echo "FAIL: $log: rc $rc, missing:$missing"; grep -m5 'error\|Error' "$log"; tail -5 "$log"; fail=1
    return 1
  fi
  echo "ok: $(basename "$log" .log)"
}

for name in gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8 gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental; do
  rm -rf "$WORK/save" "$WORK/load"
  # First run: to iteration 2 and a checkpoint there (the load directory is empty: a fresh start).
  run "$name" "$WORK/$name.first.log" --exit-interval 2; rc=$?
  check "$WORK/$name.first.log" $rc "iteration        2/       4 |" "mtp_1 loss:" "seq_load_balancing_loss:" \
    "successfully saved checkpoint from iteration       2" || continue
  # --logging-level 40: the iteration lines print (Megatron's print_rank_last), info lines do not.
  if grep -qF "fp8tron 0.1.0 (commit" "$WORK/$name.first.log"; then
    echo "FAIL: $name: --logging-level 40 should hide the version line (an info line)"; fail=1
  fi
  # Second run: resume from it to iteration 4, as the ckpt-resume test does.
  CHECKPOINT_LOAD_PATH="$WORK/save" run "$name" "$WORK/$name.resume.log" --exit-interval 4; rc=$?
  check "$WORK/$name.resume.log" $rc "successfully loaded checkpoint from $WORK/save" "iteration        4/       4 |" \
    "mtp_1 loss:"
done
# Fine-grained activation offloading (every module of its --offload-modules, together
# with the configuration's selective recomputation and pipeline layout): shrunk to iteration 2, every
# tensor offloaded (--min-offloaded-tensor-size 0; CPU-sized tensors are below the default), the
# offloaded bytes in the timer report.
off=gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading
rm -rf "$WORK/save" "$WORK/load"
run $off "$WORK/offload.log" --exit-interval 2 --min-offloaded-tensor-size 0 --timing-log-level 1; rc=$?
check "$WORK/offload.log" $rc "iteration        2/       4 |" "activation-offload"
# Fill-in-the-middle: uninterrupted to iteration 4, then stopped at 2 and resumed (its
# --ckpt-format torch_dist with --async-save: Megatron's format, written in the background).
fim=gpt3_mcore_te_tp1_pp1_dist_optimizer_fim_dataset
losses() { grep -o 'iteration *[34]/.*lm loss: [0-9.E+-]*' "$1" | sed 's/.*\(iteration *[0-9]*\).*lm loss: \(.*\)/\1 \2/'; }
rm -rf "$WORK/save" "$WORK/load"
CHECKPOINT_SAVE_PATH="$WORK/fim_straight" run $fim "$WORK/fim.straight.log"; rc=$?
if check "$WORK/fim.straight.log" $rc "iteration        4/       4 |" "validation loss at iteration 4" \
     '--fim-prefix-token "<fim_prefix>" is not in the GPT2BPETokenizer vocabulary'; then
  run $fim "$WORK/fim.first.log" --exit-interval 2; rc=$?
  check "$WORK/fim.first.log" $rc "successfully saved checkpoint from iteration       2" &&
    { CHECKPOINT_LOAD_PATH="$WORK/save" run $fim "$WORK/fim.resume.log"; rc=$?
      check "$WORK/fim.resume.log" $rc "successfully loaded Megatron's torch_dist checkpoint from $WORK/save" \
        "iteration        4/       4 |"; } &&
    if [ "$(losses "$WORK/fim.straight.log")" != "$(losses "$WORK/fim.resume.log")" ] || [ -z "$(losses "$WORK/fim.resume.log")" ]; then
      echo "FAIL: $fim: the resumed losses differ from the uninterrupted run's:"
      paste <(losses "$WORK/fim.straight.log") <(losses "$WORK/fim.resume.log"); fail=1
    else
      echo "ok: $fim resumed with the uninterrupted run's losses"
    fi
fi
# A configuration for each feature fp8tron added for Megatron's test configurations, shrunk, trains
# to iteration 2 in its own layout (and saves there, those with --save): W&B logging (offline; the 15B release
# configuration, TP 8 with sequence parallelism, its sample-based batch schedule shrunk, its
# SentencePiece tokenizer on the corpus tokenized with it), MuP, two distributed-optimizer
# instances, Megatron-FSDP ZeRO-3 and FSDP2, DeepSeek's proxy (Megatron-FSDP with EP 2, the
# all-to-all overlap and --delay-wgrad-compute, MLA, a dense then an MoE layer), the parameter
# gather overlapped with the optimizer step (PP 4, virtual stages), the deferred embedding wgrad.
export WANDB_MODE=offline WANDB_SILENT=true
if [ -f "$TOKENIZER_MODEL" ] && "$PRE" --input "$WORK/corpus.jsonl" --output-prefix "$WORK/corpus_sp" \
     --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model "$TOKENIZER_MODEL" --append-eod --workers 2 \
     >"$WORK/pre_sp.log" 2>&1; then
  rm -rf "$WORK/save" "$WORK/load" "$WANDB_SAVE_PATH"
  OWN_SHRINK=(--num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 8 --num-query-groups 8
              --seq-length 64 --max-position-embeddings 64 --micro-batch-size 1 --step-batch-size-schedule 0:8
              --make-vocab-size-divisible-by 64 --save-interval 2 --eval-interval 2 --eval-iters 1 --log-interval 1
              --device cpu --distributed-timeout-minutes 5 --split 90,8,2)
  DATA_PATH="$WORK/corpus_sp_text_document" run gpt3_15b_8t_release "$WORK/wandb.log" --exit-interval 2; rc=$?
  OWN_SHRINK=()
  no_client="the wandb package is not installed"
  if [ "${FP8TRON_TEST_WANDB_OPTIONAL:-0}" = 1 ] && [ $rc != 0 ] && grep -qF "$no_client" "$WORK/wandb.log"; then
    # A machine that cannot install packages (scripts/gpu_check.sh's GPU machines are offline):
    # the run must stop at start-up with the one line naming the fix, and the rest still runs.
    check "$WORK/wandb.log" 0 "fp8tron: error: --wandb-project: $no_client" "run scripts/setup.sh" &&
      echo "note: gpt3_15b_8t_release: no wandb client here; checked its start-up error instead"
  else
    check "$WORK/wandb.log" $rc "iteration        2/" "successfully saved checkpoint from iteration       2" &&
      { ls -d "$WANDB_SAVE_PATH"/wandb/offline-run-* >/dev/null 2>&1 ||
        { echo "FAIL: gpt3_15b_8t_release: no offline W&B run in $WANDB_SAVE_PATH"; fail=1; }; }
  fi
else
  echo "FAIL: the corpus could not be tokenized with the SentencePiece model ($TOKENIZER_MODEL)"; fail=1
fi
for name in gpt3_mcore_te_tp1_pp1_mup gpt3_mcore_te_tp2_pp1_multi_dist_optimizer_instances \
    gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor gpt3_mcore_te_tp2_pp1_fsdp2_resume_torch_dist \
    deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap \
    gpt3_mcore_te_tp1_pp4_vp1_dist_optimizer_overlap_grad_reduce_param_gather_overlap_optimizer \
    gpt3_mcore_te_tp2_pp2_defer_embedding_wgrad_compute; do
  rm -rf "$WORK/save" "$WORK/load"
  saved=()  # the configurations that save (--save), saved at iteration 2
  grep -q -- '^--save ' "$DIR/$name.args" && saved=("successfully saved checkpoint from iteration       2")
  run "$name" "$WORK/$name.log" --global-batch-size 8 --exit-interval 2; rc=$?
  check "$WORK/$name.log" $rc "iteration        2/       4 |" "${saved[@]}"
done
[ $fail = 0 ] && echo "megatron configs train: all passed"
exit $fail
