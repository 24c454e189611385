#!/usr/bin/env bash
# --print-model-plan end to end: the executable builds the run, prints how each linear layer, MLP
# and expert group runs as its modules planned it, and exits before the first step; ranks of one
# pipeline stage print once, every stage prints its own layers.
set -u
BIN=$1
MPIRUN=$2
fail=0
TINY=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 --lr 1e-3
      --train-iters 4 --vocab-size 64 --builtin-data --log-interval 2 --eval-iters 0 --device cpu --print-model-plan)
MPI=("$MPIRUN" --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1)

check() {  # check <description> <output> <exit code> then patterns: +text must appear, -text must not, !line must not
          # be a whole line, =N:text N times
  local what=$1 out=$2 rc=$3 ok=1; shift 3
  [ "$rc" = 0 ] || { echo "FAIL ($what): exit status $rc"; ok=0; }
  for p in "$@"; do
    case $p in
      +*) grep -qF -- "${p:1}" <<<"$out" || { echo "FAIL ($what): lacks '${p:1}'"; ok=0; } ;;
      -*) ! grep -qF -- "${p:1}" <<<"$out" || { echo "FAIL ($what): has '${p:1}'"; ok=0; } ;;
      !*) ! grep -qxF -- "${p:1}" <<<"$out" || { echo "FAIL ($what): has the line '${p:1}'"; ok=0; } ;;
      =*) local n=${p:1}; n=${n%%:*}; local text=${p#=*:}
          [ "$(grep -cF -- "$text" <<<"$out")" = "$n" ] || { echo "FAIL ($what): '$text' not $n times"; ok=0; } ;;
    esac
  done
  if [ $ok = 1 ]; then echo "ok: $what"; else echo "$out" | tail -30; fail=1; fi
}

# One process: the four layers alike print as one range; no step runs.
out=$("$BIN" "${TINY[@]}" 2>&1); rc=$?
check "one rank, bf16" "$out" $rc "+model plan, pipeline rank 0 of 1:" "+  layers 0-3:" \
  "+    self_attention.linear_qkv: bf16/fp32 GEMMs | one tensor-parallel rank: no communication | norm: in one op with the GEMM" \
  "+    mlp.linear_fc2: bf16/fp32 GEMMs" "+weight gradient: into its fp32 main gradient" \
  "+    mlp: activation: " "+  output_layer: bf16/fp32 GEMMs" "-iteration        1/" "!training ..."

# FP8 with the first and last layers in bf16: three ranges; the FP8 layers name their FP8 GEMMs.
out=$("$BIN" "${TINY[@]}" --fp8-format hybrid --first-last-layers-bf16 2>&1); rc=$?
check "FP8, first and last layer bf16" "$out" $rc "+  layer 0:" "+  layers 1-2:" "+  layer 3:" \
  "+    mlp.linear_fc1: FP8 GEMMs" "+    mlp: activation: GeLU fused into fc2's FP8 input cast" "-  layers 0-3:"

# Gradient-accumulation fusion off: every weight gradient goes to autograd.
out=$("$BIN" "${TINY[@]}" --no-gradient-accumulation-fusion 2>&1); rc=$?
check "no gradient-accumulation fusion" "$out" $rc "+weight gradient: to autograd" "-into its fp32 main gradient"

# Experts: the grouped GEMMs of each MoE layer's local experts.
out=$("$BIN" "${TINY[@]}" --num-experts 4 --moe-grouped-gemm --moe-router-topk 2 2>&1); rc=$?
check "mixture of experts" "$out" $rc "+    mlp.experts.linear_fc1: bf16 grouped GEMMs" "+| 4 local experts"

# --dry-run builds no model: the two are refused together.
out=$("$BIN" "${TINY[@]}" --dry-run 2>&1); rc=$?
if [ $rc = 1 ] && grep -qF -- "--print-model-plan builds the model, which --dry-run never does" <<<"$out"; then
  echo "ok: refused with --dry-run"
else
  echo "FAIL: --print-model-plan --dry-run -> rc $rc"; echo "$out" | tail -3; fail=1
fi

# Tensor parallelism with sequence parallelism and the overlap: printed once for the two ranks.
out=$("${MPI[@]}" -np 2 "$BIN" "${TINY[@]}" --tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap 2>&1); rc=$?
check "TP 2 with SP and overlap" "$out" $rc "=1:model plan, pipeline rank 0 of 1:" \
  "+    self_attention.linear_qkv: bf16/fp32 GEMMs | TP 2 with SP: all-gather of the sequence shards before, overlapped with the GEMMs (fprop " \
  "+    mlp.linear_fc2: bf16/fp32 GEMMs | TP 2 with SP: reduce-scatter to sequence shards after, overlapped" \
  "+  output_layer: bf16/fp32 GEMMs | TP 2 with SP: all-gather of the sequence shards before |"

# Two pipeline stages: each prints its own two layers.
out=$("${MPI[@]}" -np 2 "$BIN" "${TINY[@]}" --pipeline-model-parallel-size 2 2>&1); rc=$?
check "PP 2" "$out" $rc "+model plan, pipeline rank 0 of 2:" "+model plan, pipeline rank 1 of 2:" "+  layers 0-1:" \
  "+  layers 2-3:" "=1:output_layer:"

exit $fail
