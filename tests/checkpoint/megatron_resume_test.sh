#!/usr/bin/env bash
# Resuming checkpoints that Megatron-LM wrote (tests/fixtures/megatron_checkpoints): fp8tron, run
# with the flags Megatron ran with, loads iteration 10 and trains to 14 on the CPU in fp32; the lm
# loss of iterations 11-14 must equal the one Megatron printed within 1e-4 relative. Damaged or
# mismatched checkpoints fail with one line naming the file and what differs. With MPIRUN, the
# same in other parallel layouts (tensor, pipeline and expert parallel, the distributed optimizer).
# Usage: megatron_resume_test.sh FP8TRON SOURCE_DIR [MPIRUN [PYTHON]]
# (PYTHON, one with torch, makes the legacy checkpoints no fixture holds; MPIRUN may be "".
# FP8TRON_TEST_DEVICE=cuda runs the one-process cases on a GPU.)
set -u
BIN=$1
SOURCE=$2
FIXTURES=$2/tests/fixtures/megatron_checkpoints
MPIRUN=${3:-}
PYTHON=${4:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail=0
FLAGS=(--micro-batch-size 2 --global-batch-size 8 --train-iters 14 --lr 1e-3 --min-lr 1e-4
       --lr-decay-style cosine --lr-warmup-iters 2 --mock-data --tokenizer-type NullTokenizer
       --vocab-size 1024 --log-interval 1 --eval-iters 0 --eval-interval 1000 --seed 1234
       --hidden-dropout 0 --attention-dropout 0 --transformer-impl local --no-persist-layer-norm
       --no-gradient-accumulation-fusion --save-interval 10 --weight-decay 0.1 --clip-grad 1.0
       --device "${FP8TRON_TEST_DEVICE:-cpu}")

# "<iteration> <lm loss>" of every iteration line of a log (fp8tron's or Megatron's).
losses() { sed -nE 's/.*iteration +([0-9]+)\/ +[0-9]+ .*lm loss: ([0-9.E+-]+).*/\1 \2/p' "$1"; }

# compare <log> <losses.txt> [last]: iterations 11 to last (14) within 1e-4 relative.
compare() {
  awk -v logfile="$1" -v last="${3:-14}" '
    FNR == NR { got[$1] = $2; next }
    $1 > 10 && $1 <= last {
      if (!($1 in got)) { print "no lm loss for iteration " $1 " in " logfile; bad = 1; next }
      rel = (got[$1] - $2) / $2; if (rel < 0) rel = -rel
      printf "iteration %d: fp8tron %s, Megatron %s, relative %.2e\n", $1, got[$1], $2, rel
      if (rel > 1e-4) bad = 1
    }
    END { exit bad }' <(losses "$1") <(losses "$2")
}

expect_error() {  # expect_error <text> <what> -- args...: exit status 1, one error line with <text>
  local want=$1 what=$2; shift 3
  local out rc
  out=$("$BIN" "${FLAGS[@]}" "$@" 2>&1); rc=$?
  if [ $rc != 1 ] || ! grep -qF -- "$want" <<<"$out" || grep -q "successfully loaded" <<<"$out"; then
    echo "FAIL: $what -> rc $rc, output lacks: $want"; echo "$out" | tail -5; fail=1
  else
    echo "ok: $what"
  fi
}

# resume <fixture> [launcher and layout flags...]: Megatron's losses after the load.
resume() {
  local dir=$1; shift
  resume_from "$dir" "$FIXTURES/$dir/ckpt" "$FIXTURES/$dir" "$@"
}
# resume_from <name> <checkpoint> <fixture> [layout flags...]: <checkpoint> resumed with the model
# flags of <fixture> (its args.txt, --ckpt-format as the checkpoint's) prints <fixture>'s losses.
resume_from() {
  local name=$1 ckpt=$2 fixture=$3; shift 3
  local launch=() layout=()
  if [ $# -gt 0 ]; then launch=($MPIRUN --allow-run-as-root --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1); layout=("$@"); fi
  read -ra MODEL < "$fixture/args.txt"
  [ -f "$ckpt/iter_0000010/.metadata" ] || MODEL=("${MODEL[@]/torch_dist/torch}")
  local log=$WORK/$name.log rc
  name="$name${layout[*]:+ ${layout[*]}}"
  "${launch[@]}" "$BIN" "${FLAGS[@]}" "${MODEL[@]}" "${layout[@]}" --load "$ckpt" > "$log" 2>&1
  rc=$?
  if [ $rc != 0 ] || ! grep -q "successfully loaded Megatron's" "$log" || ! compare "$log" "$fixture/losses.txt"; then
    echo "FAIL: $name (rc $rc)"; tail -20 "$log"; fail=1
  else
    echo "ok: $name resumes with Megatron's losses"
  fi
}
# resume_with_checkpoint_args <fixture> [flags...]: no model flags; --use-checkpoint-args takes them
# from the arguments Megatron stored (the flags it does not take, such as the aux-loss coefficient,
# are passed as Megatron's users pass them).
resume_with_checkpoint_args() {
  local dir=$1; shift
  local log=$WORK/$dir-checkpoint-args.log format=torch_dist rc
  [[ $dir == *legacy ]] && format=torch
  "$BIN" "${FLAGS[@]}" --ckpt-format $format "$@" --use-checkpoint-args --load "$FIXTURES/$dir/ckpt" > "$log" 2>&1
  rc=$?
  if [ $rc != 0 ] || ! grep -q "Setting num_layers to 2 from checkpoint" "$log" || ! compare "$log" "$FIXTURES/$dir/losses.txt"; then
    echo "FAIL: $dir --use-checkpoint-args (rc $rc)"; tail -20 "$log"; fail=1
  else
    echo "ok: $dir resumes with the model flags Megatron stored (--use-checkpoint-args)"
  fi
}

resume gpt_torch_dist
resume gpt_torch_legacy
# More optimizer parameter groups than weight decay's two: --decoupled-lr (the embedding and
# output layer's) and MuP (the hidden matrices'), each group's Adam state found by its kind.
resume gpt_decoupled_lr_torch_legacy
resume gpt_mup_torch_legacy
resume_with_checkpoint_args llama_tp2_torch_dist
resume_with_checkpoint_args gpt_tp2pp2_torch_legacy
resume_with_checkpoint_args gpt_tp2dp2_distopt_core_0_13  # the arguments in common.pt
resume_with_checkpoint_args moe_ep2_torch_dist --moe-aux-loss-coeff 0.01 --moe-token-dispatcher-type alltoall
resume moe_ep2_torch_dist  # saved by two expert-parallel ranks, one file each
resume gpt_tp2pp2_torch_dist  # saved by four ranks, 2-way tensor x 2-way pipeline parallel
# "<MB read> <MB of tensors in the checkpoint>" of a load's log (its first rank's line).
read_share() { sed -nE "s/.* > read ([0-9.]+) MB of the checkpoint's ([0-9.]+) MB.*/\1 \2/p" "$1" | head -1; }
share=$(read_share "$WORK/gpt_tp2pp2_torch_dist.log")
if [ -z "$share" ] || [ "${share% *}" != "${share#* }" ]; then
  echo "FAIL: one process should read every chunk once: '$share'"; fail=1
else
  echo "ok: one process reads every chunk once ($share MB)"
fi
resume mla_torch_dist  # multi-latent attention: the latents' norms under Megatron's local names
resume gpt_tp2pp2_torch_legacy  # the same run in Megatron's legacy format: four rank files
# "<MB read>" of the tensors in a legacy load's rank files (its first rank's line).
legacy_read() { sed -nE "s/.* > read ([0-9.]+) MB of the [0-9.]+ MB of tensors in model_optim_rng.pt.*/\1/p" "$1" | head -1; }
legacy_whole=$(legacy_read "$WORK/gpt_tp2pp2_torch_legacy.log")
resume llama_tp2_torch_dist
resume gpt_dp2_distopt_torch_dist  # the distributed optimizer's flat buffers
# Megatron-Core 0.13's layout: common.pt, the distributed optimizer's flattened per-weight state
resume gpt_tp2dp2_distopt_core_0_13
# ... saved by eight ranks (TP2 x PP2 x DP2): each tensor- and pipeline-parallel rank's buffers
# hold its parts of the weights (a SwiGLU fc1's gate and up halves split apart).
resume llama_tp2pp2_distopt_torch_dist
# bf16 runs: the mixed-precision optimizer's fp32 main weights beside the bf16 ones (in the legacy
# file, tensors that carry Python attributes).
resume gpt_bf16_torch_dist
resume gpt_bf16_torch_legacy
resume gpt_sgd_torch_dist  # torch.optim.SGD's momentum buffers, no step
resume gpt_sgd_torch_legacy
resume gpt_dp2_distopt_torch_legacy  # the distributed optimizer's distrib_optim.pt
# TP2 x EP2 with whole experts: of the four ranks only mp_rank_00_000 and mp_rank_01_001 write.
resume moe_tp2_etp1_ep2_torch_legacy
# The weights alone give iteration 11's loss (the optimizer only acts after it).
read -ra MODEL < "$FIXTURES/gpt_torch_legacy/args.txt"
"$BIN" "${FLAGS[@]}" "${MODEL[@]}" --no-load-optim --load "$FIXTURES/gpt_torch_legacy/ckpt" > "$WORK/weights.log" 2>&1
if [ $? != 0 ] || ! compare "$WORK/weights.log" "$FIXTURES/gpt_torch_legacy/losses.txt" 11; then
  echo "FAIL: --no-load-optim"; tail -20 "$WORK/weights.log"; fail=1
else
  echo "ok: --no-load-optim loads the weights"
fi
# Legacy checkpoints that no fixture holds, made from the fixtures as Megatron's code lays them
# out (megatron_legacy_variants.py, needs PYTHON with torch): a bf16 run's, whose mixed-precision
# optimizer keeps the fp32 main weights beside the bf16 ones; MoE ones, whose optimizer is a chain
# of the dense and the expert parameters' (saved by one rank, by two expert-parallel ranks,
# mp_rank_00_000 and mp_rank_00_001, by TP2 x EP2, and by TP2 x EP2 with whole experts); the
# distributed optimizer's, its state in distrib_optim.pt.
read -ra LEGACY < "$FIXTURES/gpt_torch_legacy/args.txt"
read -ra MOE_LEGACY < "$FIXTURES/moe_ep2_torch_dist/args.txt"
if [ -n "$PYTHON" ]; then
  VARIANTS=$SOURCE/tests/checkpoint/megatron_legacy_variants.py
  "$PYTHON" "$VARIANTS" bf16 "$WORK/bf16_legacy" && "$PYTHON" "$VARIANTS" moe "$WORK/moe_legacy" 1 &&
    "$PYTHON" "$VARIANTS" moe "$WORK/moe_ep2_legacy" 2 && "$PYTHON" "$VARIANTS" moe "$WORK/moe_tp2_ep2_legacy" 2 2 &&
    "$PYTHON" "$VARIANTS" distopt "$WORK/distopt_legacy" ||
    { echo "FAIL: megatron_legacy_variants.py"; fail=1; }
  # Resumed in fp32, the bf16 checkpoint's fp32 main weights give the very losses of the fp32 run
  # it was made from (its bf16 weights would not: 6.733323 instead of 6.733141 at iteration 11).
  resume_from bf16_legacy "$WORK/bf16_legacy" "$FIXTURES/gpt_torch_legacy"
  if [ "$(losses "$WORK/bf16_legacy.log")" != "$(losses "$WORK/gpt_torch_legacy.log")" ]; then
    echo "FAIL: the bf16 checkpoint's main weights should resume exactly as the fp32 fixture"; fail=1
  else
    echo "ok: the bf16 checkpoint's fp32 main weights resume exactly as the fp32 fixture"
  fi
  resume_from moe_legacy "$WORK/moe_legacy" "$FIXTURES/moe_ep2_torch_dist"
  resume_from moe_ep2_legacy "$WORK/moe_ep2_legacy" "$FIXTURES/moe_ep2_torch_dist"
  resume_from moe_tp2_ep2_legacy "$WORK/moe_tp2_ep2_legacy" "$FIXTURES/moe_ep2_torch_dist"  # four rank files
  [ -n "$MPIRUN" ] && resume_from moe_ep2_legacy "$WORK/moe_ep2_legacy" "$FIXTURES/moe_ep2_torch_dist" \
    --expert-model-parallel-size 2
  resume_from distopt_legacy "$WORK/distopt_legacy" "$FIXTURES/gpt_dp2_distopt_torch_dist"
  [ -n "$MPIRUN" ] && resume_from distopt_legacy "$WORK/distopt_legacy" "$FIXTURES/gpt_dp2_distopt_torch_dist" \
    --use-distributed-optimizer
  rm "$WORK/distopt_legacy/iter_0000010/mp_rank_00/distrib_optim.pt"
  expect_error "distrib_optim.pt is missing: the distributed optimizer's state of its rank lies there" \
    "a legacy distributed optimizer's missing distrib_optim.pt" -- "${LEGACY[@]}" --load "$WORK/distopt_legacy"
  # Whole experts on both tensor-parallel ranks (--expert-tensor-parallel-size 1): two of the four
  # (tp, ep) directories, mp_rank_00_000 and mp_rank_01_001, as Megatron writes them.
  "$PYTHON" "$VARIANTS" moe "$WORK/moe_tp2_etp1_ep2_legacy" 2 2 1 ||
    { echo "FAIL: megatron_legacy_variants.py moe 2 2 1"; fail=1; }
  resume_from moe_tp2_etp1_ep2_legacy "$WORK/moe_tp2_etp1_ep2_legacy" "$FIXTURES/moe_ep2_torch_dist"
  [ -n "$MPIRUN" ] && resume_from moe_tp2_etp1_ep2_legacy "$WORK/moe_tp2_etp1_ep2_legacy" \
    "$FIXTURES/moe_ep2_torch_dist" --expert-model-parallel-size 2
  rm -r "$WORK/moe_tp2_etp1_ep2_legacy/iter_0000010/mp_rank_01_001"
  expect_error "lacks a directory holding tensor-parallel rank 1's part of pipeline stage 0 (mp_rank_01_EEE)" \
    "a missing directory of a legacy checkpoint with whole experts" -- "${MOE_LEGACY[@]/torch_dist/torch}" \
    --load "$WORK/moe_tp2_etp1_ep2_legacy"
  # SGD: fp8tron's torch_dist save of an SGD run laid out as Megatron's torch format (torch.optim.SGD's
  # momentum buffers) resumes with the losses of the uninterrupted run, which its momentum decides.
  SGD=("${LEGACY[@]}" --optimizer sgd --sgd-momentum 0.9)
  "$BIN" "${FLAGS[@]}" "${SGD[@]/torch/torch_dist}" > "$WORK/sgd-full.log" 2>&1 &&
    "$BIN" "${FLAGS[@]}" "${SGD[@]/torch/torch_dist}" --exit-interval 10 --save "$WORK/sgd_dist" > "$WORK/sgd-save.log" 2>&1 &&
    "$PYTHON" "$VARIANTS" sgd "$WORK/sgd_legacy" "$WORK/sgd_dist/iter_0000010" &&
    "$BIN" "${FLAGS[@]}" "${SGD[@]}" --load "$WORK/sgd_legacy" > "$WORK/sgd-resume.log" 2>&1
  if [ $? != 0 ] || ! grep -q "successfully loaded Megatron's torch checkpoint" "$WORK/sgd-resume.log" ||
     [ "$(losses "$WORK/sgd-resume.log" | awk '$1 > 10')" != "$(losses "$WORK/sgd-full.log" | awk '$1 > 10')" ]; then
    echo "FAIL: a legacy SGD checkpoint should resume as the uninterrupted run"; tail -5 "$WORK/sgd-resume.log"; fail=1
  else
    echo "ok: a legacy SGD checkpoint (momentum buffers) resumes as the uninterrupted run"
  fi
  "$PYTHON" "$VARIANTS" moe "$WORK/moe_etp2_legacy" 2 4 2 &&
    expect_error "was saved with --expert-tensor-parallel-size 2 and --tensor-model-parallel-size 4" \
      "legacy expert-parallel ranks whose experts are split otherwise than the dense layers" -- \
      "${MOE_LEGACY[@]/torch_dist/torch}" --load "$WORK/moe_etp2_legacy"
  cp -r "$WORK/moe_ep2_legacy" "$WORK/lost_expert_rank" && rm -r "$WORK/lost_expert_rank/iter_0000010/mp_rank_00_001"
  expect_error "lacks the directory of tensor-parallel rank 0, pipeline stage 0, expert-parallel rank 1 (mp_rank_00_001)" \
    "a missing expert-parallel rank directory of a legacy checkpoint" -- "${MOE_LEGACY[@]/torch_dist/torch}" \
    --load "$WORK/lost_expert_rank"
fi

if [ -n "$MPIRUN" ]; then
  resume gpt_torch_dist --tensor-model-parallel-size 2
  resume gpt_torch_legacy --pipeline-model-parallel-size 2
  resume gpt_torch_dist --use-distributed-optimizer
  resume moe_ep2_torch_dist --expert-model-parallel-size 2
  resume gpt_tp2pp2_torch_dist --pipeline-model-parallel-size 2
  # The first stage reads its layer, the embeddings and their moments: not the second's layer.
  share=$(read_share "$WORK/gpt_tp2pp2_torch_dist.log")
  if [ -z "$share" ] || ! awk -v r="${share% *}" -v t="${share#* }" 'BEGIN { exit !(r < 0.75 * t) }'; then
    echo "FAIL: the first of two pipeline stages should read part of the checkpoint: '$share'"; fail=1
  else
    echo "ok: the first of two pipeline stages reads part of the checkpoint ($share MB)"
  fi
  # A damaged chunk that only the second stage reads (bytes 37406... of __2_0.distcp: its chunk of
  # the stacked QKV weight): both ranks stop, nothing loaded.
  cp -r "$FIXTURES/gpt_tp2pp2_torch_dist/ckpt" "$WORK/damaged_chunk" && chmod -R u+w "$WORK/damaged_chunk"
  printf 'garbage!' | dd of="$WORK/damaged_chunk/iter_0000010/__2_0.distcp" bs=1 seek=37406 conv=notrunc status=none
  read -ra TP2PP2 < "$FIXTURES/gpt_tp2pp2_torch_dist/args.txt"
  out=$($MPIRUN --allow-run-as-root --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 "$BIN" "${FLAGS[@]}" \
        "${TP2PP2[@]}" --pipeline-model-parallel-size 2 --load "$WORK/damaged_chunk" 2>&1); rc=$?
  if [ $rc = 0 ] || ! grep -q "__2_0.distcp, a chunk of decoder.layers.self_attention.linear_qkv.weight" <<<"$out" ||
     ! grep -q "could not be read on another rank" <<<"$out" || grep -q "successfully loaded" <<<"$out"; then
    echo "FAIL: a damaged chunk read by one rank -> rc $rc"; echo "$out" | tail -8; fail=1
  else
    echo "ok: a damaged chunk read by one rank stops every rank before anything is loaded"
  fi
  resume gpt_tp2pp2_torch_legacy --tensor-model-parallel-size 2
  # Each tensor-parallel rank reads its halves of the rank files' tensors (the replicated norms and
  # biases whole): about half of what one process reads.
  half=$(legacy_read "$WORK/gpt_tp2pp2_torch_legacy.log")
  if [ -z "$legacy_whole" ] || [ -z "$half" ] ||
     ! awk -v w="$legacy_whole" -v h="$half" 'BEGIN { exit !(h > 0 && h < 0.55 * w) }'; then
    echo "FAIL: a tensor-parallel rank should read about half the legacy files' bytes one process reads ($half of $legacy_whole MB)"
    fail=1
  else
    echo "ok: a tensor-parallel rank reads its part of the legacy files ($half of the $legacy_whole MB one process reads)"
  fi
  resume llama_tp2_torch_dist --tensor-model-parallel-size 2
  resume gpt_tp2dp2_distopt_core_0_13 --tensor-model-parallel-size 2
  resume gpt_tp2dp2_distopt_core_0_13 --use-distributed-optimizer
  resume gpt_dp2_distopt_torch_dist --use-distributed-optimizer
  resume llama_tp2pp2_distopt_torch_dist --tensor-model-parallel-size 2 --use-distributed-optimizer
  resume llama_tp2pp2_distopt_torch_dist --pipeline-model-parallel-size 2
  # Of the distributed optimizer's flat buffers (three quarters of the tensors) the first stage
  # reads its own weights' state and the main weights it searches them in, not the whole buffers.
  share=$(read_share "$WORK/llama_tp2pp2_distopt_torch_dist.log")
  if [ -z "$share" ] || ! awk -v r="${share% *}" -v t="${share#* }" 'BEGIN { exit !(r < 0.6 * t) }'; then
    echo "FAIL: the first of two pipeline stages should read its part of the optimizer's buffers: '$share'"; fail=1
  else
    echo "ok: the first of two pipeline stages reads its part of the optimizer's buffers ($share MB)"
  fi
  resume gpt_dp2_distopt_torch_legacy --use-distributed-optimizer
  resume gpt_sgd_torch_dist --tensor-model-parallel-size 2
  resume moe_tp2_etp1_ep2_torch_legacy --expert-model-parallel-size 2
  resume mla_torch_dist --tensor-model-parallel-size 2
  # The model and the parallel layout from the arguments Megatron stored (four ranks: TP2 x PP2).
  log=$WORK/mp-args.log
  $MPIRUN --allow-run-as-root --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 "$BIN" "${FLAGS[@]}" \
    --ckpt-format torch_dist --use-checkpoint-args --use-mp-args-from-checkpoint-args \
    --load "$FIXTURES/gpt_tp2pp2_torch_dist/ckpt" > "$log" 2>&1
  if [ $? != 0 ] || ! grep -q "Setting pipeline_model_parallel_size to 2 from checkpoint" "$log" ||
     ! compare "$log" "$FIXTURES/gpt_tp2pp2_torch_dist/losses.txt"; then
    echo "FAIL: --use-mp-args-from-checkpoint-args"; tail -20 "$log"; fail=1
  else
    echo "ok: --use-mp-args-from-checkpoint-args takes Megatron's TP2 x PP2 layout"
  fi
fi


read -ra DIST < "$FIXTURES/gpt_torch_dist/args.txt"
read -ra LEGACY < "$FIXTURES/gpt_torch_legacy/args.txt"
expect_error "--hidden-size 64 there, 128 here" "another model's shape" -- \
  "${DIST[@]}" --hidden-size 128 --load "$FIXTURES/gpt_torch_dist/ckpt"
expect_error "holds Adam's moments, this run uses --optimizer sgd: run with --optimizer adam" "Adam's state into SGD" -- \
  "${DIST[@]}" --optimizer sgd --load "$FIXTURES/gpt_torch_dist/ckpt"
out=$("$BIN" "${FLAGS[@]}" "${DIST[@]}" --optimizer sgd --no-load-optim --load "$FIXTURES/gpt_torch_dist/ckpt" 2>&1)
if [ $? != 0 ] || ! grep -q "successfully loaded Megatron's" <<<"$out"; then
  echo "FAIL: --no-load-optim should load the weights into another optimizer's run"; tail -3 <<<"$out"; fail=1
else
  echo "ok: --no-load-optim loads the weights into another optimizer's run"
fi
expect_error "pass --auto-detect-ckpt-format" "torch_dist under --ckpt-format torch" -- \
  "${LEGACY[@]}" --load "$FIXTURES/gpt_torch_dist/ckpt"
cp -r "$FIXTURES/gpt_torch_dist/ckpt" "$WORK/truncated" && chmod -R u+w "$WORK/truncated"
truncate -s 1000000 "$WORK/truncated/iter_0000010/__0_0.distcp"
expect_error "__0_0.distcp: truncated" "a truncated .distcp file" -- "${DIST[@]}" --load "$WORK/truncated"
cp -r "$FIXTURES/gpt_torch_legacy/ckpt" "$WORK/missing" && chmod -R u+w "$WORK/missing"
rm "$WORK/missing/iter_0000010/mp_rank_00/model_optim_rng.pt"
expect_error "model_optim_rng.pt" "a missing model_optim_rng.pt" -- "${LEGACY[@]}" --load "$WORK/missing"
# A byte flipped inside a tensor of a legacy file (bytes 60000... of the embedding's entry): zip's
# CRC-32 of the entry names it, where LibTorch's reader would load the wrong value.
cp -r "$FIXTURES/gpt_torch_legacy/ckpt" "$WORK/flipped" && chmod -R u+w "$WORK/flipped"
printf 'garbage!' | dd of="$WORK/flipped/iter_0000010/mp_rank_00/model_optim_rng.pt" bs=1 seek=60000 conv=notrunc status=none
expect_error "model_optim_rng.pt: entry data/0 (embedding.word_embeddings.weight) fails its CRC-32 check" \
  "a corrupted tensor in a legacy file" -- "${LEGACY[@]}" --load "$WORK/flipped"
cp -r "$FIXTURES/gpt_tp2pp2_torch_legacy/ckpt" "$WORK/lost_rank" && chmod -R u+w "$WORK/lost_rank"
rm -r "$WORK/lost_rank/iter_0000010/mp_rank_01_001"
expect_error "lacks the directory of tensor-parallel rank 1, pipeline stage 1 (mp_rank_01_001)" \
  "a missing rank directory of a legacy checkpoint" -- "${LEGACY[@]}" --load "$WORK/lost_rank"
read -ra MOE < "$FIXTURES/moe_ep2_torch_dist/args.txt"
expect_error "--num-experts 4 there, 0 here" "an MoE checkpoint into a dense model" -- \
  "${DIST[@]}" --load "$FIXTURES/moe_ep2_torch_dist/ckpt"
cp -r "$FIXTURES/moe_ep2_torch_dist/ckpt" "$WORK/lost_shard" && chmod -R u+w "$WORK/lost_shard"
rm "$WORK/lost_shard/iter_0000010/__1_0.distcp"
expect_error "__1_0.distcp" "a missing .distcp file of another rank" -- "${MOE[@]}" --load "$WORK/lost_shard"
exit $fail
