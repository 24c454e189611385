#!/usr/bin/env bash
# Saving in Megatron's torch_dist format (--save with --ckpt-format torch_dist, and
# --ckpt-convert-format torch_dist): on the CPU in fp32, with the model of the Megatron fixture
# (tests/fixtures/megatron_checkpoints/gpt_torch_dist):
#   - a run that saves at iteration 10 and one resumed from that checkpoint print exactly the losses
#     of an uninterrupted run (in one process also those of a resume from fp8tron's own format),
#     in one process (fp32, bf16, fp16) and, with MPIRUN, in a TP2/PP2 layout;
#   - PyTorch's own reader (torch_dist_check.py) finds the fixture's names, global shapes and dtypes,
#     every tensor equal to fp8tron's own checkpoint of the same state, and a common state that
#     loads with weights_only=True holding what Megatron reads;
#   - the fixture converted (loaded and saved again at iteration 10) holds tensors equal to the
#     fixture's and its common state's values, in one process and, with MPIRUN, in TP2/PP2 and DP2;
#   - an MoE model (local layers) converted from Megatron's EP2 fixture holds its names, shapes,
#     objects, tensors and chained optimizer state, in one process and over EP2, and an EP2 run
#     resumes exactly from its own torch_dist save;
#   - with MPIRUN, MoE with the routers' expert bias, and with a dense and an MoE layer (Megatron then
#     numbers its layers instead of stacking them), resumes exactly, over EP2 and in one process,
#     and MoE with Transformer Engine's layers (grouped experts) under TE's names over EP2;
#   - with MPIRUN, a Llama-like model over TP2 x PP2 x 2 virtual stages resumes exactly and writes
#     the tensors one process writes for the same state;
#   - with MPIRUN, the distributed optimizer (DP2, bf16, TP2 x DP2) written in Megatron's
#     fully_reshardable layout resumes exactly, also in one process without it, and also when
#     written in the background (--async-save);
#   - a multi-token-prediction layer resumes exactly, under Megatron's names, and with MPIRUN one
#     that is an MoE layer, its experts stacked over the experts, over EP2 and in one process;
#   - FP8 (delayed scaling) resumes exactly, its recipe state under fp8tron's own names, in one
#     process and, with MPIRUN, over TP2 and EP2, and resumes in bf16 with the FP8 flags dropped;
#   - --decoupled-lr and MuP (with MoE) resume exactly and write Megatron's parameter groups in
#     its order; SGD with momentum resumes exactly from torch.optim.SGD's momentum buffers and
#     parameter groups, and its checkpoint is refused by name in an Adam run;
#   - a save killed before its commit leaves no checkpoint; what cannot be written in torch_dist
#     yet saves fp8tron's format with a notice, or is refused in a conversion.
# Without MPIRUN the one-process cases run, with it only the multi-process ones (two tests, so the
# one-process part shares the machine with other tests).
# Usage: torch_dist_save_test.sh FP8TRON SOURCE_DIR PYTHON [MPIRUN]
set -u
BIN=$1
SRC=$2
PY=$3
MPIRUN=${4:-}
CHECK=$SRC/tests/checkpoint/torch_dist_check.py
FIXTURE=$SRC/tests/fixtures/megatron_checkpoints/gpt_torch_dist
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
fail=0
read -ra MODEL < "$FIXTURE/args.txt"  # includes --ckpt-format torch_dist
FLAGS=(--micro-batch-size 2 --global-batch-size 8 --train-iters 14 --lr 1e-3 --min-lr 1e-4
       --lr-decay-style cosine --lr-warmup-iters 2 --mock-data --tokenizer-type NullTokenizer
       --vocab-size 1024 --log-interval 1 --eval-iters 0 --eval-interval 1000 --seed 1234
       --hidden-dropout 0 --attention-dropout 0 --transformer-impl local --no-persist-layer-norm
       --no-gradient-accumulation-fusion --save-interval 10 --weight-decay 0.1 --clip-grad 1.0
       --device cpu "${MODEL[@]}")
NATIVE=()
for f in "${FLAGS[@]}"; do [ "$f" = --ckpt-format ] || [ "$f" = torch_dist ] || NATIVE+=("$f"); done

losses() { sed -nE 's/.*iteration +([0-9]+)\/ +[0-9]+ .*lm loss: ([0-9.E+-]+).*/\1 \2/p' "$1" | awk '$1 > 10'; }

# run <name> <np> <flags...>: one process (np 1) or mpirun -np N.
run() {
  local name=$1 np=$2; shift 2
  local launch=()
  [ "$np" -gt 1 ] && launch=($MPIRUN --allow-run-as-root --oversubscribe --bind-to none -np "$np" -x OMP_NUM_THREADS=1)
  "${launch[@]}" "$BIN" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  if [ $rc != 0 ]; then echo "FAIL: $name (rc $rc)"; tail -15 "$WORK/$name.log"; fail=1; return 1; fi
}

same_losses() {  # same_losses <what> <log> <reference log>: iterations 11-14 printed identically
  if [ "$(losses "$2" | wc -l)" != 4 ] || ! diff <(losses "$2") <(losses "$3") > /dev/null; then
    echo "FAIL: $1: losses differ"; diff <(losses "$2") <(losses "$3"); fail=1
  else
    echo "ok: $1"
  fi
}

# close_losses <what> <log> <reference log>: iterations 11-14 within 2e-6 relative (another
# layout: the data-parallel gradient sums add the micro-batches in another order).
close_losses() {
  if [ "$(losses "$2" | wc -l)" != 4 ] ||
     ! awk 'FNR == NR { want[$1] = $2; next } { d = ($2 - want[$1]) / want[$1]; if (d < 0) d = -d; if (d > 2e-6) bad = 1 }
            END { exit bad }' <(losses "$3") <(losses "$2"); then
    echo "FAIL: $1: losses differ"; diff <(losses "$2") <(losses "$3"); fail=1
  else
    echo "ok: $1"
  fi
}

check() {  # check <what> <torch_dist_check.py arguments...>
  local what=$1; shift
  if ! "$PY" "$CHECK" "$@" > "$WORK/check.log" 2>&1; then echo "FAIL: $what"; tail -20 "$WORK/check.log"; fail=1
  else echo "ok: $what"; fi
}

# resume_test <tag> <np> [layout flags...]; with WITH_NATIVE=1 also saved in fp8tron's own format
# ($WORK/<tag>-native) and resumed from it, the same losses.
resume_test() {
  local tag=$1 np=$2; shift 2
  run "$tag-full" "$np" "${FLAGS[@]}" "$@" || return
  run "$tag-save" "$np" "${FLAGS[@]}" "$@" --exit-interval 10 --save "$WORK/$tag-td" || return
  run "$tag-resume" "$np" "${FLAGS[@]}" "$@" --load "$WORK/$tag-td" || return
  grep -q "successfully loaded Megatron's torch_dist" "$WORK/$tag-resume.log" || { echo "FAIL: $tag: not loaded as torch_dist"; fail=1; }
  same_losses "$tag: resumed from torch_dist = uninterrupted" "$WORK/$tag-resume.log" "$WORK/$tag-full.log"
  [ "${WITH_NATIVE:-0}" = 1 ] || return 0
  run "$tag-nsave" "$np" "${NATIVE[@]}" "$@" --exit-interval 10 --save "$WORK/$tag-native" || return
  run "$tag-nresume" "$np" "${NATIVE[@]}" "$@" --load "$WORK/$tag-native" || return
  same_losses "$tag: resumed from torch_dist = resumed from fp8tron's format" "$WORK/$tag-resume.log" "$WORK/$tag-nresume.log"
}

# convert_test <tag> <np> [layout flags...]: the fixture loaded and saved again at iteration 10.
convert_test() {
  local tag=$1 np=$2; shift 2
  run "$tag-convert" "$np" "${FLAGS[@]}" "$@" --load "$FIXTURE/ckpt" --ckpt-convert-format torch_dist \
      --ckpt-convert-save "$WORK/$tag-conv" || return
  local out=$WORK/$tag-conv/torch_dist/iter_0000010
  check "$tag: converted fixture: Megatron's names and shapes" metadata "$out" "$FIXTURE/ckpt/iter_0000010"
  check "$tag: converted fixture: tensors equal the fixture's" tensors "$out" "$FIXTURE/ckpt/iter_0000010"
  check "$tag: converted fixture: common state as the fixture's" common "$out" "$FIXTURE/ckpt/iter_0000010"
}

# FP8 with delayed scaling (both parts).
FP8=(--transformer-impl transformer_engine --bf16 --fp8-format hybrid --fp8-amax-history-len 16 --fp8-amax-compute-algo max)
if [ -z "$MPIRUN" ]; then  # the one-process part
WITH_NATIVE=1 resume_test single 1
check "single: Megatron's names and shapes" metadata "$WORK/single-td/iter_0000010" "$FIXTURE/ckpt/iter_0000010"
check "single: tensors equal fp8tron's own checkpoint" tensors "$WORK/single-td/iter_0000010" "$WORK/single-native/iter_0000010"
check "single: common state as Megatron reads it" common "$WORK/single-td/iter_0000010" "$FIXTURE/ckpt/iter_0000010"
convert_test single 1
# bf16 and fp16: the fp32 main weights (optimizer.state.fp32_param.*) and fp16's loss scaler too.
# (fp16 from a loss scale of 128: Megatron's 2^32 overflows this model's fp16 gradients for longer
# than the run.)
for precision in bf16 fp16; do
  extra=(); [ $precision = fp16 ] && extra=(--initial-loss-scale 128)
  WITH_NATIVE=1 resume_test "$precision" 1 --$precision "${extra[@]}"
  check "$precision: tensors equal fp8tron's own checkpoint" tensors "$WORK/$precision-td/iter_0000010" \
    "$WORK/$precision-native/iter_0000010"
done
# FP8 (delayed scaling): each linear layer's recipe state as a tensor of fp8tron's own
# (fp8tron_fp8_state.<module>), so the resume is exact; the tensors, that state included, equal
# fp8tron's own checkpoint's; resumed with the FP8 flags dropped, as Megatron without Transformer
# Engine would, the run goes on in bf16.
WITH_NATIVE=1 resume_test fp8 1 "${FP8[@]}"
check "fp8: tensors equal fp8tron's own checkpoint, FP8 recipe state included" tensors "$WORK/fp8-td/iter_0000010" \
  "$WORK/fp8-native/iter_0000010"
run fp8-into-bf16 1 "${FLAGS[@]}" --bf16 --load "$WORK/fp8-td" && [ "$(losses "$WORK/fp8-into-bf16.log" | wc -l)" = 4 ] &&
  echo "ok: fp8: resumed in bf16" || { echo "FAIL: fp8: not resumed in bf16"; fail=1; }
# A multi-token-prediction layer: its tensors and objects under Megatron's mtp.layers.0.* names.
resume_test mtp 1 --mtp-num-layers 1
if "$PY" - "$WORK/mtp-td/iter_0000010" <<'PY'
import sys, torch.distributed.checkpoint as dcp
m = dcp.FileSystemReader(sys.argv[1]).read_metadata().state_dict_metadata
want = {"mtp.layers.0.eh_proj.weight": [64, 128], "mtp.layers.0.enorm.weight": [64], "mtp.layers.0.hnorm.weight": [64],
        "mtp.layers.0.final_layernorm.weight": [64], "mtp.layers.0.transformer_layer.mlp.linear_fc1.weight": [256, 64],
        "mtp.layers.0.transformer_layer.self_attention.linear_qkv.layer_norm_weight": [64],
        "optimizer.state.exp_avg.mtp.layers.0.eh_proj.weight": [64, 128]}
objects = ["mtp.layers.0.eh_proj._extra_state/shard_0_1",
           "mtp.layers.0.transformer_layer.self_attention.linear_qkv._extra_state/shard_0_1"]
bad = [f"{k}: {list(m[k].size) if k in m else 'missing'}" for k, shape in want.items() if k not in m or list(m[k].size) != shape]
bad += [k for k in objects if k not in m]
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
then echo "ok: mtp: Megatron's names"
else echo "FAIL: mtp: Megatron's names"; fail=1; fi
# Multi-latent attention: with local layers the latents' norms and the norm before the dense MLP
# under the names of Megatron's local MLA modules (it maps no names for them), with Transformer
# Engine's layers fused into the next linear, as fp8tron's.
MLA=(--multi-latent-attention --q-lora-rank 32 --kv-lora-rank 16 --qk-head-dim 16 --qk-pos-emb-head-dim 8
     --v-head-dim 16 --qk-layernorm --position-embedding-type rope --rope-type rope --no-rope-fusion)
resume_test mla 1 "${MLA[@]}"
resume_test mla-te 1 "${MLA[@]}" --transformer-impl transformer_engine
mla_names() {  # mla_names <checkpoint> <name:size...>: each name there, stacked over the 2 layers
  "$PY" - "$@" <<'PY'
import sys, torch.distributed.checkpoint as dcp
m = dcp.FileSystemReader(sys.argv[1]).read_metadata().state_dict_metadata
bad = []
for want in sys.argv[2:]:
    name, size = want.split(":")
    if name not in m or list(m[name].size) != [2, int(size)]:
        bad.append(f"{name}: {list(m[name].size) if name in m else 'missing'}")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
}
L=decoder.layers.
if mla_names "$WORK/mla-td/iter_0000010" "${L}input_layernorm.weight:64" "${L}self_attention.q_layernorm.weight:32" \
     "${L}self_attention.kv_layernorm.weight:16" "${L}pre_mlp_layernorm.weight:64" \
     "optimizer.state.exp_avg.${L}self_attention.kv_layernorm.weight:16" &&
   mla_names "$WORK/mla-te-td/iter_0000010" "${L}input_layernorm.weight:64" \
     "${L}self_attention.linear_q_up_proj.layer_norm_weight:32" "${L}self_attention.linear_kv_up_proj.layer_norm_weight:16" \
     "${L}mlp.linear_fc1.layer_norm_weight:64"
then echo "ok: mla: Megatron's names, local and Transformer Engine's"
else echo "FAIL: mla: Megatron's names"; fail=1; fi
# More parameter groups, in Megatron's order (none overridden first, then by the sorted overrides),
# which Megatron matches to its own by position: --decoupled-lr (the embedding and output layer's
# max_lr and min_lr), and MuP at width multiplier 2 (the hidden matrices' max_lr, min_lr and
# Adam epsilon halved), with MoE (the experts' optimizer has their group only).
group() {  # group <wd_mult> <max_lr> <min_lr> <eps> <default_config>
  printf '{"wd_mult": %s, "max_lr": %s, "min_lr": %s, "eps": %s, "default_config": %s}' "$@"
}
resume_test decoupled 1 --decoupled-lr 5e-3 --decoupled-min-lr 1e-5 --untie-embeddings-and-output-weights
check "decoupled: Megatron's parameter groups" groups "$WORK/decoupled-td/iter_0000010" \
  "[[$(group 1 1e-3 1e-4 1e-8 true), $(group 1 5e-3 1e-5 1e-8 false), $(group 0 1e-3 1e-4 1e-8 true)]]"
MUP=(--use-mup --mup-base-hidden-size 32 --num-experts 4 --moe-router-topk 2 --moe-token-dispatcher-type alltoall
     --moe-aux-loss-coeff 0.01 --swiglu --disable-bias-linear)
resume_test mup 1 "${MUP[@]}"
check "mup: Megatron's parameter groups" groups "$WORK/mup-td/iter_0000010" \
  "[[$(group 1 1e-3 1e-4 1e-8 true), $(group 1 5e-4 5e-5 5e-9 false), $(group 0 1e-3 1e-4 1e-8 true)],
    [$(group 1 5e-4 5e-5 5e-9 false)]]"
# SGD with momentum: torch.optim.SGD's momentum buffers (optimizer.state.momentum_buffer.*) and
# parameter groups, no step; resumed with its momentum, the losses of the uninterrupted run.
resume_test sgd 1 --optimizer sgd --sgd-momentum 0.9
sgd_group='{"momentum": 0.9, "dampening": 0.0, "nesterov": false, "wd_mult": 1}'
check "sgd: torch.optim.SGD's parameter groups" groups "$WORK/sgd-td/iter_0000010" \
  "[[$sgd_group, ${sgd_group/\"wd_mult\": 1/\"wd_mult\": 0}]]"
if "$PY" - "$WORK/sgd-td/iter_0000010" <<'PY'
import sys
import torch.distributed.checkpoint as dcp
names = dcp.FileSystemReader(sys.argv[1]).read_metadata().state_dict_metadata
weights = [n for n in names if not n.startswith("optimizer.") and n.endswith(("weight", "bias"))]
missing = [w for w in weights if "optimizer.state.momentum_buffer." + w not in names]
adam = [n for n in names if "exp_avg" in n]
print("weights without momentum:", missing, "Adam's tensors:", adam[:3])
sys.exit(1 if missing or adam or not weights else 0)
PY
then echo "ok: sgd: a momentum buffer per weight, no Adam state"
else echo "FAIL: sgd: momentum buffers"; fail=1; fi
fi
if [ -n "$MPIRUN" ]; then
  # The FP8 state written by the first rank of each amax group: tensor-parallel rank 0, and each
  # expert's expert-parallel owner.
  resume_test fp8-tp2 2 "${FP8[@]}" --tensor-model-parallel-size 2
  resume_test fp8-ep2 2 "${FP8[@]}" --num-experts 4 --moe-router-topk 2 --moe-token-dispatcher-type alltoall \
    --moe-aux-loss-coeff 0.01 --swiglu --disable-bias-linear --expert-model-parallel-size 2
  resume_test tp2pp2 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
  check "tp2pp2: Megatron's names and shapes" metadata "$WORK/tp2pp2-td/iter_0000010" "$FIXTURE/ckpt/iter_0000010"
  check "tp2pp2: common state" common "$WORK/tp2pp2-td/iter_0000010"
  ls "$WORK/tp2pp2-td/iter_0000010"/__{0,1,2,3}_0.distcp > /dev/null || { echo "FAIL: tp2pp2: a rank file is missing"; fail=1; }
  convert_test tp2pp2 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
  convert_test dp2 2
  # The distributed optimizer, written in Megatron's fully_reshardable layout (each weight's fp32
  # main copy and moments, laid out like the weight; shards that start inside a row become several
  # chunks): DP2 and TP2 x DP2 runs resume exactly, also without the distributed optimizer in one
  # process, and the fixture converted over DP2 holds the fixture's tensors.
  resume_test distopt 2 --use-distributed-optimizer
  check "distopt: the distributed optimizer's layout" distopt "$WORK/distopt-td/iter_0000010"
  run distopt-into-one 1 "${FLAGS[@]}" --load "$WORK/distopt-td" &&
    close_losses "distopt: resumed in one process = resumed over DP2" "$WORK/distopt-into-one.log" "$WORK/distopt-resume.log"
  resume_test distopt-bf16 2 --use-distributed-optimizer --bf16
  check "distopt-bf16: the distributed optimizer's layout" distopt "$WORK/distopt-bf16-td/iter_0000010"
  resume_test distopt-tp2 4 --use-distributed-optimizer --tensor-model-parallel-size 2
  # Written in the background (--async-save): each rank's file by its writer thread, committed
  # once every rank's is done.
  resume_test async-distopt 2 --use-distributed-optimizer --async-save
  grep -q "the checkpoint is written in the background" "$WORK/async-distopt-save.log" &&
    [ -e "$WORK/async-distopt-td/iter_0000010/.metadata" ] && echo "ok: async-distopt: saved in the background as torch_dist" ||
    { echo "FAIL: async-distopt: not saved in the background as torch_dist"; fail=1; }
  check "distopt-tp2: the distributed optimizer's layout" distopt "$WORK/distopt-tp2-td/iter_0000010"
  if run distopt-convert 2 "${FLAGS[@]}" --use-distributed-optimizer --load "$FIXTURE/ckpt" \
       --ckpt-convert-format torch_dist --ckpt-convert-save "$WORK/distopt-conv"; then
    check "distopt: converted fixture: the fixture's tensors, each weight's main copy" distopt \
      "$WORK/distopt-conv/torch_dist/iter_0000010" "$FIXTURE/ckpt/iter_0000010"
  fi
  # A Llama-like model (SwiGLU, GQA, RMSNorm, RoPE, untied output) over TP2 x PP2 with two virtual
  # stages: its checkpoint equals the same state written by one process (converted), and a resume
  # prints the uninterrupted losses.
  LLAMA=("${FLAGS[@]}" --num-layers 4 --swiglu --normalization RMSNorm --group-query-attention --num-query-groups 2
         --position-embedding-type rope --untie-embeddings-and-output-weights)
  LAYOUT=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1)
  if run llama-full 4 "${LLAMA[@]}" "${LAYOUT[@]}" && run llama-save 4 "${LLAMA[@]}" "${LAYOUT[@]}" --exit-interval 10 --save "$WORK/llama" &&
     run llama-resume 4 "${LLAMA[@]}" "${LAYOUT[@]}" --load "$WORK/llama" &&
     run llama-convert 1 "${LLAMA[@]}" --load "$WORK/llama" --ckpt-convert-format torch_dist --ckpt-convert-save "$WORK/llama-one"; then
    same_losses "llama tp2pp2vpp2: resumed from torch_dist = uninterrupted" "$WORK/llama-resume.log" "$WORK/llama-full.log"
    check "llama tp2pp2vpp2: tensors equal one process's" tensors "$WORK/llama/iter_0000010" "$WORK/llama-one/torch_dist/iter_0000010"
  fi
fi

# MoE with local layers: Megatron's fixture written by two expert-parallel ranks, converted, holds
# the fixture's names, shapes, objects, tensors and chained optimizer state; with MPIRUN the same
# from EP2, and a run saved over EP2 resumes exactly.
MOE_FIXTURE=$SRC/tests/fixtures/megatron_checkpoints/moe_ep2_torch_dist
MOE=(--num-experts 4 --moe-router-topk 2 --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 0.01 --swiglu
     --disable-bias-linear)
moe_convert_test() {  # moe_convert_test <tag> <np> [layout flags...]
  local tag=$1 np=$2; shift 2
  run "$tag-convert" "$np" "${FLAGS[@]}" "${MOE[@]}" "$@" --load "$MOE_FIXTURE/ckpt" --ckpt-convert-format torch_dist \
      --ckpt-convert-save "$WORK/$tag-conv" || return
  local out=$WORK/$tag-conv/torch_dist/iter_0000010 ref=$MOE_FIXTURE/ckpt/iter_0000010
  check "$tag: converted MoE fixture: Megatron's names, shapes and objects" metadata "$out" "$ref"
  check "$tag: converted MoE fixture: tensors equal the fixture's" tensors "$out" "$ref"
  check "$tag: converted MoE fixture: chained optimizer state as the fixture's" common "$out" "$ref"
}
if [ -z "$MPIRUN" ]; then moe_convert_test moe 1; fi
if [ -n "$MPIRUN" ]; then
  moe_convert_test moe-ep2 2 --expert-model-parallel-size 2
  resume_test moe-ep2 2 "${MOE[@]}" --expert-model-parallel-size 2
  check "moe-ep2: Megatron's names and shapes" metadata "$WORK/moe-ep2-td/iter_0000010" "$MOE_FIXTURE/ckpt/iter_0000010"
  # MoE layers with a shared expert.
  resume_test moe-shared 2 "${MOE[@]}" --moe-shared-expert-intermediate-size 64 --expert-model-parallel-size 2
  # The routers' expert bias (a buffer, stored as Megatron's modules store it: stacked over layers).
  resume_test moe-bias 2 "${MOE[@]}" --moe-router-enable-expert-bias --moe-router-score-function sigmoid \
    --expert-model-parallel-size 2
  if "$PY" - "$WORK/moe-bias-td/iter_0000010" <<'PY'
import sys, torch.distributed.checkpoint as dcp
m = dcp.FileSystemReader(sys.argv[1]).read_metadata().state_dict_metadata["decoder.layers.mlp.router.expert_bias"]
sys.exit(0 if list(m.size) == [2, 4] and str(m.properties.dtype) == "torch.float32" else 1)
PY
  then echo "ok: moe-bias: decoder.layers.mlp.router.expert_bias [2, 4] fp32"
  else echo "FAIL: moe-bias: no decoder.layers.mlp.router.expert_bias [2, 4] fp32"; fail=1; fi
  # A dense layer, then an MoE layer (--moe-layer-freq a list): Megatron stores each layer under its
  # own number, the experts stacked within it, and names the objects accordingly.
  resume_test moe-mixed 2 "${MOE[@]}" --moe-layer-freq "([0]+[1])" --expert-model-parallel-size 2
  run moe-mixed-into-one 1 "${FLAGS[@]}" "${MOE[@]}" --moe-layer-freq "([0]+[1])" --load "$WORK/moe-mixed-td" &&
    same_losses "moe-mixed: resumed in one process = resumed over EP2" "$WORK/moe-mixed-into-one.log" \
      "$WORK/moe-mixed-resume.log"
  # A multi-token-prediction layer that is an MoE layer: its routed experts stacked over the
  # experts only (Megatron never stacks an MTP layer with others); resumed over EP2 and in one process.
  resume_test mtp-moe 2 "${MOE[@]}" --mtp-num-layers 1 --expert-model-parallel-size 2
  run mtp-moe-into-one 1 "${FLAGS[@]}" "${MOE[@]}" --mtp-num-layers 1 --load "$WORK/mtp-moe-td" &&
    same_losses "mtp-moe: resumed in one process = resumed over EP2" "$WORK/mtp-moe-into-one.log" "$WORK/mtp-moe-resume.log"
  if "$PY" - "$WORK/mtp-moe-td/iter_0000010" <<'PY'
import sys, torch.distributed.checkpoint as dcp
m = dcp.FileSystemReader(sys.argv[1]).read_metadata().state_dict_metadata
p = "mtp.layers.0.transformer_layer."
want = {p + "mlp.router.weight": [4, 64], p + "mlp.experts.experts.linear_fc1.weight": [4, 256, 64],
        "optimizer.state.exp_avg." + p + "mlp.experts.experts.linear_fc2.weight": [4, 64, 128],
        p + "mlp.linear_fc1.layer_norm_weight": [64], "decoder.layers.mlp.experts.experts.linear_fc1.weight": [2, 4, 256, 64]}
objects = [p + "mlp.experts.experts.linear_fc2._extra_state/shard_3_4", p + "self_attention.linear_proj._extra_state/shard_0_1",
           "mtp.layers.0.eh_proj._extra_state/shard_0_1"]
bad = [f"{k}: {list(m[k].size) if k in m else 'missing'}" for k, shape in want.items() if k not in m or list(m[k].size) != shape]
bad += [k for k in objects if k not in m] + [k for k in m if k.startswith(p + "mlp.experts.linear_fc") or k.startswith(p + "pre_mlp")]
bad += [k for k in m if k.startswith(p + "mlp.linear_fc1._extra_state")]
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
  then echo "ok: mtp-moe: Megatron's names"
  else echo "FAIL: mtp-moe: Megatron's names"; fail=1; fi
  # Transformer Engine's layers (grouped experts): the norms under TE's names, the core attention's
  # _extra_state, each expert's _extra_state as the sequential experts'.
  resume_test moe-te 2 "${MOE[@]}" --transformer-impl transformer_engine --moe-grouped-gemm --expert-model-parallel-size 2
  if "$PY" - "$WORK/moe-te-td/iter_0000010" <<'PY'
import sys, torch.distributed.checkpoint as dcp
m = dcp.FileSystemReader(sys.argv[1]).read_metadata().state_dict_metadata
want = {"decoder.layers.pre_mlp_layernorm.weight": [2, 64], "decoder.layers.self_attention.linear_qkv.layer_norm_weight": [2, 64],
        "decoder.layers.mlp.experts.experts.linear_fc1.weight": [2, 4, 256, 64]}
objects = ["decoder.layers.self_attention.core_attention._extra_state/shard_1_2",
           "decoder.layers.mlp.experts.experts.linear_fc2._extra_state/shard_1.3_2.4"]
bad = [f"{k}: {list(m[k].size) if k in m else 'missing'}" for k, shape in want.items() if k not in m or list(m[k].size) != shape]
bad += [k for k in objects if k not in m] + [k for k in m if "mlp.linear_fc1.layer_norm" in k or "input_layernorm" in k]
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
  then echo "ok: moe-te: Transformer Engine's names"
  else echo "FAIL: moe-te: Transformer Engine's names"; fail=1; fi
  if "$PY" - "$WORK/moe-mixed-td/iter_0000010" <<'PY'
import sys, torch.distributed.checkpoint as dcp
m = dcp.FileSystemReader(sys.argv[1]).read_metadata().state_dict_metadata
want = {"decoder.layers.0.mlp.linear_fc1.weight": [256, 64], "decoder.layers.1.mlp.router.weight": [4, 64],
        "decoder.layers.1.mlp.experts.experts.linear_fc1.weight": [4, 256, 64],
        "optimizer.state.exp_avg.decoder.layers.1.mlp.experts.experts.linear_fc2.weight": [4, 64, 128],
        "decoder.layers.0.self_attention.linear_qkv.weight": [192, 64]}
objects = ["decoder.layers.0.mlp.linear_fc1._extra_state/shard_0_1",
           "decoder.layers.1.self_attention.linear_proj._extra_state/shard_0_1",
           "decoder.layers.1.mlp.experts.experts.linear_fc2._extra_state/shard_3_4"]
bad = [f"{k}: {list(m[k].size) if k in m else 'missing'}" for k, shape in want.items() if k not in m or list(m[k].size) != shape]
bad += [k for k in objects if k not in m] + [k for k in m if k.startswith("decoder.layers.mlp")]
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
  then echo "ok: moe-mixed: each layer under its own number"
  else echo "FAIL: moe-mixed: the names of Megatron's non-homogeneous layers"; fail=1; fi
fi

if [ -z "$MPIRUN" ]; then  # the one-process part
# A save killed before its commit leaves no checkpoint and no tracker.
( "$BIN" "${FLAGS[@]}" --exit-interval 10 --save "$WORK/killed" --fp8tron-test-kill-at save:metadata-written \
  > "$WORK/killed.log" 2>&1 ) 2> /dev/null
rc=$?
if [ $rc != 137 ] || [ -e "$WORK/killed/iter_0000010" ] || [ -e "$WORK/killed/latest_checkpointed_iteration.txt" ]; then
  echo "FAIL: a torch_dist save killed before its commit (rc $rc) left a checkpoint"; ls -la "$WORK/killed"; fail=1
else
  echo "ok: a killed save leaves no checkpoint"
fi

expect_error() {  # expect_error <text> <what> <flags...>
  local want=$1 what=$2; shift 2
  local out rc
  out=$("$BIN" "${FLAGS[@]}" "$@" 2>&1); rc=$?
  if [ $rc != 1 ] || ! grep -qF -- "$want" <<<"$out"; then echo "FAIL: $what -> rc $rc, output lacks: $want"; echo "$out" | tail -3; fail=1
  else echo "ok: $what"; fi
}
# FP8 recipe state for some linear layers and not others (saved with --first-last-layers-bf16,
# loaded without): refused by name before anything is loaded.
run fp8-partial-save 1 "${FLAGS[@]}" "${FP8[@]}" --num-layers 4 --first-last-layers-bf16 --exit-interval 10 \
    --save "$WORK/fp8-partial" &&
  expect_error "holds the FP8 recipe state of 8 linear layers but not of 8 others" "partial FP8 state refused" \
    "${FP8[@]}" --num-layers 4 --load "$WORK/fp8-partial"
[ -d "$WORK/sgd-td" ] && expect_error "holds SGD's momentum, this run uses --optimizer adam: run with --optimizer sgd" \
  "SGD's state into Adam refused" --load "$WORK/sgd-td"
# What fp8tron cannot write in torch_dist yet: a plain save falls back to fp8tron's format, saying
# so (Megatron's own configurations pass --ckpt-format torch_dist); a conversion is refused.
expect_fallback() {  # expect_fallback <flag named> <flags...>
  local want="--ckpt-format torch_dist: fp8tron does not write Megatron's torch_dist format with $1 yet"; shift
  local out rc
  out=$("$BIN" "${FLAGS[@]}" "$@" --dry-run 2>&1); rc=$?
  if [ $rc != 0 ] || ! grep -qF -- "$want" <<<"$out"; then echo "FAIL: fallback -> rc $rc, output lacks: $want"; echo "$out" | tail -3; fail=1
  else echo "ok: $want"; fi
}
expect_fallback "--use-megatron-fsdp / --use-torch-fsdp2" --use-megatron-fsdp --save "$WORK/x"
expect_fallback "--optimizer sgd with --use-distributed-optimizer" --optimizer sgd --use-distributed-optimizer --save "$WORK/x"
expect_fallback "--optimizer muon" --optimizer muon --save "$WORK/x"
expect_error "--use-megatron-fsdp / --use-torch-fsdp2 with --ckpt-convert-format torch_dist is not supported yet" \
  "conversion with Megatron-FSDP refused" \
  --use-megatron-fsdp --load "$FIXTURE/ckpt" --ckpt-convert-format torch_dist --ckpt-convert-save "$WORK/x"
expect_error "--ckpt-convert-format torch: fp8tron converts into Megatron's torch_dist format only" "convert to torch refused" \
  --load "$FIXTURE/ckpt" --ckpt-convert-format torch --ckpt-convert-save "$WORK/x"
# Without --ckpt-format, fp8tron's own format, as before.
run native-default 1 "${NATIVE[@]}" --train-iters 3 --save "$WORK/default" && \
  { [ -e "$WORK/default/iter_0000003/fp8tron_checkpoint.json" ] && echo "ok: fp8tron's format by default" || { echo "FAIL: default format"; fail=1; }; }
fi
exit $fail
