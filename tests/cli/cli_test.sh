#!/usr/bin/env bash
# End-to-end checks of the executable: what users see for good and bad command lines.
set -u
BIN=$1
SRC=$2
fail=0
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 --lr 1e-3
      --train-iters 4 --vocab-size 64 --builtin-data --log-interval 2 --eval-iters 1 --eval-interval 4 --device cpu)

expect() {  # expect <exit code> <text in output> -- args...
  local want_rc=$1 want_text=$2; shift 3
  local out rc
  out=$("$BIN" "$@" 2>&1); rc=$?
  if [ "$rc" != "$want_rc" ] || ! grep -qF -- "$want_text" <<<"$out"; then
    echo "FAIL: fp8tron $* -> rc $rc (want $want_rc), output lacks: $want_text"; echo "$out" | tail -5; fail=1
  else
    echo "ok: $want_text"
  fi
}

expect_absent() {  # expect_absent <text in output> <text not in output> -- args...: exit status 0
  local want_text=$1 absent=$2; shift 3
  local out rc
  out=$("$BIN" "$@" 2>&1); rc=$?
  if [ "$rc" != 0 ] || ! grep -qF -- "$want_text" <<<"$out" || grep -qF -- "$absent" <<<"$out"; then
    echo "FAIL: fp8tron $* -> rc $rc, want '$want_text' without '$absent'"; echo "$out" | tail -5; fail=1
  else
    echo "ok: '$want_text' without '$absent'"
  fi
}

expect 0 "iteration        4/       4 |" -- "${TINY[@]}"
# --logging-level / MEGATRON_LOGGING_LEVEL (the flag wins): info lines (the version line) hide at
# 30, warnings at 40; the iteration and validation lines always print (Megatron's print_rank_last).
expect_absent "iteration        4/       4 |" "fp8tron 0.1.0 (commit" -- "${TINY[@]}" --logging-level 30
expect 0 "--no-masked-softmax-fusion is accepted but has no effect" -- "${TINY[@]}" --logging-level 30 --no-masked-softmax-fusion
MEGATRON_LOGGING_LEVEL=40 expect_absent "validation loss at iteration 4" "has no effect" -- "${TINY[@]}" --no-masked-softmax-fusion
MEGATRON_LOGGING_LEVEL=40 expect 0 "fp8tron 0.1.0 (commit" -- "${TINY[@]}" --logging-level 20
MEGATRON_LOGGING_LEVEL=WARNING expect 1 "MEGATRON_LOGGING_LEVEL='WARNING' is not an integer logging level" -- "${TINY[@]}"
expect 0 "validation loss at iteration 4" -- "${TINY[@]}"
expect 0 "usage: fp8tron" -- --help
expect 1 "did you mean '--num-layers'?" -- "${TINY[@]}" --num-layer 3
expect 1 "--bf16 and --fp16 cannot be used together" -- "${TINY[@]}" --bf16 --fp16
WORLD_SIZE=2 expect 1 "--expert-model-parallel-size 2 needs --num-experts" -- "${TINY[@]}" --expert-model-parallel-size 2 --dry-run
expect 1 "--moe-token-dispatcher-type flex (DeepEP/HybridEP) is not supported" -- "${TINY[@]}" --num-experts 4 \
  --moe-token-dispatcher-type flex
WORLD_SIZE=4 expect 0 "mixture of experts: 2 MoE layers of 2" -- "${TINY[@]}" --num-experts 8 --expert-model-parallel-size 4 \
  --global-batch-size 8 --dry-run
expect 1 "--overlap-param-gather is only supported with --use-distributed-optimizer" -- "${TINY[@]}" --overlap-param-gather
expect 0 "iteration        4/       4 |" -- "${TINY[@]}" --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
# --num-distributed-optimizer-instances: Megatron's partial distributed optimizer, with its rules.
expect 1 "--num-distributed-optimizer-instances 2 needs --use-distributed-optimizer" -- "${TINY[@]}" \
  --num-distributed-optimizer-instances 2
expect 1 "--num-distributed-optimizer-instances 2 must divide the data-parallel size x --context-parallel-size (1)" -- \
  "${TINY[@]}" --use-distributed-optimizer --num-distributed-optimizer-instances 2
WORLD_SIZE=4 expect 1 "--num-distributed-optimizer-instances 3 must divide the data-parallel size x" -- "${TINY[@]}" --use-distributed-optimizer --num-distributed-optimizer-instances 3 --global-batch-size 8 --dry-run
WORLD_SIZE=4 expect 0 "dry run: configuration is valid" -- "${TINY[@]}" --use-distributed-optimizer \
  --num-distributed-optimizer-instances 2 --global-batch-size 8 --dry-run
expect 0 "iteration        4/       4 |" -- "${TINY[@]}" --use-distributed-optimizer --num-distributed-optimizer-instances 1
WORLD_SIZE=2 expect 1 "multi-process CPU runs use MPI: launch with mpirun" -- "${TINY[@]}" --tensor-model-parallel-size 2
expect 1 "--openai-gelu is not supported by fp8tron" -- "${TINY[@]}" --openai-gelu
# Tensor-parallel overlap: the plan in the dry run, Megatron's and MindSpeed's refusals.
WORLD_SIZE=4 expect 0 "qkv_fprop ring_exchange, qkv_dgrad bulk" -- "${TINY[@]}" --tensor-model-parallel-size 4 \
  --sequence-parallel --tp-comm-overlap --dry-run
WORLD_SIZE=2 expect 1 "can happen only when sequence parallelism is enabled" -- "${TINY[@]}" --tensor-model-parallel-size 2 \
  --tp-comm-overlap --dry-run
WORLD_SIZE=2 expect 1 "mc2 and coc can not be used together" -- "${TINY[@]}" --tensor-model-parallel-size 2 \
  --sequence-parallel --use-ascend-mc2 --use-ascend-coc --dry-run
expect 0 "has no effect in fp8tron" -- "${TINY[@]}" --no-masked-softmax-fusion
expect 0 "dry run: configuration is valid" -- "${TINY[@]}" --dry-run
# A 1,000-GPU job planned on this machine without connecting to anyone.
WORLD_SIZE=1000 expect 0 "world 1000 = TP 2 x CP 1 x DP 250 x PP 2" -- "${TINY[@]}" --tensor-model-parallel-size 2 \
  --pipeline-model-parallel-size 2 --global-batch-size 500 --dry-run
if ! command -v nvidia-smi >/dev/null 2>&1; then
  expect 1 "--device cuda: no CUDA GPU" -- "${TINY[@]}" --device cuda
fi
# Checkpoints: save, resume, a mismatched model, Megatron's --ckpt-format values.
CKPT=$(mktemp -d)
expect 0 "successfully saved checkpoint from iteration       4 to $CKPT [ t 1/1, p 1/1 ]" -- "${TINY[@]}" --save "$CKPT"
expect 0 "successfully loaded checkpoint from $CKPT [ t 1/1, p 1/1 ] at iteration 4" -- "${TINY[@]}" --train-iters 6 --load "$CKPT" \
  --override-opt-param-scheduler
# Extending --train-iters changes the LR and weight-decay spans: refused unless a schedule is chosen, as Megatron does.
expect 1 "total number of iterations is" -- "${TINY[@]}" --train-iters 6 --load "$CKPT"
expect 0 "fp8tron 0.1.0 (commit " -- --version
expect 1 "hidden_size is 32 in the checkpoint but 64 here (--hidden-size)" -- "${TINY[@]}" --load "$CKPT" --hidden-size 64
expect 0 "fp8tron writes its own checkpoint format" -- "${TINY[@]}" --ckpt-format torch --save "$CKPT/format"
# fp8tron-export (built next to fp8tron): the checkpoint as a Hugging Face directory.
EXPORT="$(dirname "$BIN")/fp8tron-export"
if out=$("$EXPORT" --load "$CKPT" --output "$CKPT/hf" 2>&1) && grep -qF "as a gpt2 model to $CKPT/hf" <<<"$out" &&
   [ -f "$CKPT/hf/model.safetensors" ] && [ -f "$CKPT/hf/config.json" ]; then
  echo "ok: fp8tron-export writes a gpt2 directory"
else
  echo "FAIL: fp8tron-export --load $CKPT --output $CKPT/hf (is $EXPORT built?)"; echo "$out" | tail -3; fail=1
fi
# --exit-signal-handler: SIGTERM saves at the next iteration boundary and exits with status 0.
"$BIN" "${TINY[@]}" --train-iters 1000000 --save "$CKPT/sig" --exit-signal-handler >"$CKPT/sig.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "^training \.\.\." "$CKPT/sig.log" 2>/dev/null && break; sleep 0.1; done
kill -TERM $pid; wait $pid; rc=$?
if [ $rc = 0 ] && grep -qF "exiting program after receiving SIGTERM." "$CKPT/sig.log" && [ -f "$CKPT/sig/latest_checkpointed_iteration.txt" ]; then
  echo "ok: SIGTERM saves and exits cleanly"
else
  echo "FAIL: SIGTERM with --exit-signal-handler -> rc $rc"; tail -5 "$CKPT/sig.log"; fail=1
fi
rm -rf "$CKPT"
# --profile --use-pytorch-profiler: a Chrome trace of iterations 2..3 in the TensorBoard directory.
PROF=$(mktemp -d)
expect 0 "profile written to $PROF/" -- "${TINY[@]}" --profile --use-pytorch-profiler --profile-step-start 1 \
  --profile-step-end 3 --tensorboard-dir "$PROF"
expect 1 "--use-pytorch-profiler writes its trace to --tensorboard-dir" -- "${TINY[@]}" --profile --use-pytorch-profiler
rm -rf "$PROF"
# pretrain_gpt.py's defaults and Megatron's rules, as a Megatron script meets them.
MOCK=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 --lr 1e-3
      --train-iters 4 --mock-data --log-interval 2 --eval-iters 1 --eval-interval 4 --device cpu)
expect 1 "GPT2BPETokenizer (pretrain_gpt.py's default), which needs --vocab-file and --merge-file" -- "${MOCK[@]}" --dry-run
expect 0 "using a NullTokenizer of --vocab-size 64 ids" -- "${MOCK[@]}" --vocab-size 64
expect 0 "Overriding default arguments for tokenizer_type:GPT2BPETokenizer with tokenizer_type:NullTokenizer" -- \
  "${MOCK[@]}" --tokenizer-type NullTokenizer --vocab-size 64 --dry-run
expect 0 "--split has no effect with --mock-data" -- "${MOCK[@]}" --vocab-size 64 --split 99,1,0 --dry-run
expect 0 "dry run: configuration is valid" -- "${TINY[@]}" --lr-warmup-samples 0 --dry-run
expect 1 "--lr-warmup-samples is for --train-samples" -- "${TINY[@]}" --lr-warmup-samples 8 --dry-run
# Interleaved schedules Megatron accepts: 5 micro-batches on 4 stages in groups of 5.
WORLD_SIZE=8 expect 0 "dry run: configuration is valid" -- "${TINY[@]}" --num-layers 12 --pipeline-model-parallel-size 4 \
  --num-layers-per-virtual-pipeline-stage 1 --micro-batch-size 4 --global-batch-size 40 \
  --microbatch-group-size-per-virtual-pipeline-stage 5 --dry-run
WORLD_SIZE=8 expect 1 "micro-batches (5) to be a multiple of 4" -- "${TINY[@]}" --num-layers 12 --pipeline-model-parallel-size 4 \
  --num-layers-per-virtual-pipeline-stage 1 --micro-batch-size 4 --global-batch-size 40 --dry-run
WORLD_SIZE=2 expect 0 "dry run: configuration is valid" -- "${TINY[@]}" --num-layers 15 --pipeline-model-parallel-size 2 \
  --pipeline-model-parallel-layout 'Et*3|(tt|)*6L' --global-batch-size 8 --dry-run
WORLD_SIZE=4 expect 0 "dry run: configuration is valid" -- "${TINY[@]}" --num-layers 6 --pipeline-model-parallel-size 4 \
  --num-virtual-stages-per-pipeline-rank 2 --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split \
  --global-batch-size 8 --dry-run
# Model variants train end to end on the CPU.
expect 0 "mtp_1 loss:" -- "${TINY[@]}" --multi-latent-attention --q-lora-rank 16 --kv-lora-rank 16 --qk-head-dim 8 \
  --qk-pos-emb-head-dim 8 --v-head-dim 8 --qk-layernorm --mtp-num-layers 1 --position-embedding-type rope \
  --rotary-scaling-factor 4
SAMPLES=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 --lr 1e-3
         --vocab-size 64 --builtin-data --eval-iters 0 --device cpu)
expect 0 "global batch size:     4 |" -- "${SAMPLES[@]}" --train-samples 24 --global-batch-size 8 \
  --rampup-batch-size 4 4 8 --log-interval 1
expect 0 "iteration        4/       4 |" -- "${TINY[@]}" --optimizer muon --calculate-per-token-loss --dataloader-type cyclic
# A dry run fails exactly when training would: a flag whose feature has not landed.
expect 1 "not supported yet: --tensor-parallel-num-weight-shards" -- "${TINY[@]}" --tensor-parallel-num-weight-shards 2 --dry-run
# The MoE configurations train, scaled down to CPU size (their routing, balancing losses, shared
# expert and dispatcher as configured), and log Megatron's MoE losses on the iteration line.
SMALL=(--num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --seq-length 32
       --max-position-embeddings 32 --vocab-size 256 --micro-batch-size 2 --global-batch-size 4 --train-iters 8
       --log-interval 2 --device cpu)
expect 0 "load_balancing_loss: " -- --config "$SRC/configs/mixtral-style.json" "${SMALL[@]}" --num-query-groups 2
expect 0 "seq_load_balancing_loss: " -- --config "$SRC/configs/deepseek-style.json" "${SMALL[@]}" --moe-ffn-hidden-size 32 \
  --moe-shared-expert-intermediate-size 64 --moe-layer-freq "([0]+[1])"
# A --save that cannot be created is refused before training, naming the flag and the reason.
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
: > "$SCRATCH/a-file"
expect 1 "--save $SCRATCH/a-file/run cannot be created: a part of that path is a file, not a directory" -- "${TINY[@]}" \
  --save "$SCRATCH/a-file/run" --save-interval 2
expect 1 "--save $SCRATCH/a-file cannot be created: it is a file, not a directory" -- "${TINY[@]}" --save "$SCRATCH/a-file"
# A configuration error in a multi-rank run is printed once, by rank 0, with the exit status of one.
out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 3 --oversubscribe --bind-to none \
      "$BIN" "${TINY[@]}" --init-method-std -1 2>&1); rc=$?
if [ "$rc" != 1 ] || [ "$(grep -c "fp8tron: error: " <<<"$out")" != 1 ] ||
   ! grep -qF -- "--init-method-std must be positive" <<<"$out"; then
  echo "FAIL: a configuration error under mpirun -np 3 -> rc $rc, want the line once:"; echo "$out" | tail -8; fail=1
else
  echo "ok: a configuration error under mpirun is printed once"
fi
# --eval-global-batch-size: one validation iteration of 4 sequences reads and averages the same
# samples as two iterations of the global batch (2), so the validation loss is the same.
valid_loss() { "$BIN" "$@" 2>&1 | grep -o "validation loss at iteration 4 | lm loss value: [^ ]*"; }
two_iters=$(valid_loss "${TINY[@]}" --eval-iters 2)
one_wide=$(valid_loss "${TINY[@]}" --eval-iters 1 --eval-global-batch-size 4)
one_narrow=$(valid_loss "${TINY[@]}" --eval-iters 1)
if [ -z "$two_iters" ] || [ "$two_iters" != "$one_wide" ] || [ "$one_wide" = "$one_narrow" ]; then
  echo "FAIL: --eval-global-batch-size 4: '$one_wide', want '$two_iters' (2 iterations of 2), not '$one_narrow'"; fail=1
else
  echo "ok: --eval-global-batch-size 4 evaluates what two iterations of 2 do"
fi
expect 1 "--eval-global-batch-size (3) must be a positive multiple" -- "${TINY[@]}" --eval-global-batch-size 3
# --eval-micro-batch-size: the same validation samples in one micro-batch of 4 instead of two of 2
# give the same loss up to the order of the fp32 sums (each sequence has as many loss tokens).
one_micro=$(valid_loss "${TINY[@]}" --eval-iters 1 --eval-global-batch-size 4 --eval-micro-batch-size 4)
if [ -z "$one_micro" ] || ! awk -v a="${one_wide##*: }" -v b="${one_micro##*: }" \
     'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * a) }'; then
  echo "FAIL: --eval-micro-batch-size 4: '$one_micro', want '$one_wide' (two micro-batches of 2)"; fail=1
else
  echo "ok: --eval-micro-batch-size 4 evaluates what two micro-batches of 2 do"
fi
expect 1 "--eval-global-batch-size (2) must be a positive multiple of --eval-micro-batch-size (4)" -- "${TINY[@]}" \
  --eval-micro-batch-size 4

if [ $fail = 0 ]; then echo "cli: all passed"; fi
exit $fail
