#!/usr/bin/env bash
# Megatron-LM resumes fp8tron's torch_dist checkpoints: fp8tron trains the small GPT of
# tests/fixtures/megatron_checkpoints for 10 iterations and saves with --ckpt-format torch_dist;
# Megatron-LM's own pretrain_gpt.py loads that checkpoint and trains iterations 11-14; its lm loss
# must be fp8tron's uninterrupted run's (1e-4 relative in fp32, 1e-4 in bf16). Cases: fp32 and bf16
# in one process; saved by TP2 x PP2 and resumed by Megatron at TP2; saved by one process and
# resumed by Megatron at TP2 x PP2; LLaMA-style (RMSNorm, SwiGLU, RoPE, GQA, untied); a
# multi-token-prediction layer (--mtp-num-layers 1, rotary positions); --decoupled-lr; MuP; SGD; MoE (4 experts, top-2, alltoall, local layers)
# saved and resumed over two expert-parallel ranks, also with a dense layer first and with the
# routers' expert bias, and with an MoE multi-token-prediction layer; the distributed optimizer (its fully_reshardable
# layout) saved over DP2 and resumed by Megatron over DP2, in bf16 too, and over TP2; an FP8 run
# resumed by Megatron in bf16.
#
# Megatron logs the first iteration of a job without resetting its loss accumulators, so the
# second line it prints after a resume (iteration 12) is the mean of iterations 11 and 12; that
# line is compared with the mean of fp8tron's two.
#
# Needs a GPU (Megatron-LM does) and a Megatron-LM checkout whose Python imports (torch; no
# Transformer Engine needed: --transformer-impl local; where neither Apex nor TE is installed,
# scripts/megatron_without_apex_or_te.py lets Megatron load a distributed optimizer's checkpoint). Ranks share the GPUs when there are fewer
# GPUs than ranks (each is given its own NCCL host identity).
# Usage: scripts/megatron_resume_check.sh MEGATRON_LM_DIR   (BENCH_OUT: where the logs go; ONLY: the
# names of the cases to run, space-separated, e.g. ONLY="moe-ep2 distopt-dp2")
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source .setup/env.sh
MLM=$(cd "${1:?usage: $0 MEGATRON_LM_DIR}" && pwd)
[ -f "$MLM/pretrain_gpt.py" ] || { echo "$MLM has no pretrain_gpt.py: pass a Megatron-LM checkout" >&2; exit 2; }
OUT=$(mkdir -p "${BENCH_OUT:-bench-logs}/megatron-resume" && cd "${BENCH_OUT:-bench-logs}/megatron-resume" && pwd)
rm -rf "$OUT"/ckpt-*
source scripts/megatron_launch.sh
read -ra MODEL < tests/fixtures/megatron_checkpoints/gpt_torch_dist/args.txt  # includes --ckpt-format torch_dist
COMMON=("${MEGATRON_COMMON[@]}" "${MODEL[@]}")
LLAMA=(--normalization RMSNorm --swiglu --position-embedding-type rope --no-rope-fusion --group-query-attention
       --num-query-groups 2 --untie-embeddings-and-output-weights --disable-bias-linear)
fail=0

fp8tron() {  # fp8tron <log> <ranks> <flags...>
  local log=$1 ranks=$2; shift 2
  if [ "$ranks" = 1 ]; then ./build/fp8tron "$@" > "$log" 2>&1
  else ./tests/parallel/nccl_launch.sh mpirun "$ranks" ./build/fp8tron "$@" > "$log" 2>&1; fi
}

# compare <name> <fp8tron log> <Megatron log> <tolerance>
compare() {
  awk -v name="$1" -v tol="$4" '
    FNR == NR { mine[$1] = $2; next }
    $1 > 10 { theirs[$1] = $2 }
    END {
      bad = 0
      for (i = 11; i <= 14; i++) {
        if (!(i in theirs) || !(i in mine)) { print "FAIL: " name ": no lm loss for iteration " i; bad = 1; continue }
        want = (i == 12) ? (mine[11] + mine[12]) / 2 : mine[i]
        rel = (theirs[i] - want) / want; if (rel < 0) rel = -rel
        line = line sprintf(" %d: %.6e/%.6e", i, theirs[i], want)
        if (rel > tol) bad = 1
      }
      print (bad ? "FAIL: " : "ok: ") name " (iteration: Megatron/fp8tron)" line
      exit bad
    }' <(losses "$2") <(losses "$3") || fail=1
}

# check <name> <fp8tron ranks> <Megatron ranks> <tolerance> <fp8tron layout> -- <Megatron layout> -- <model flags>
check() {
  local name=$1 franks=$2 mranks=$3 tol=$4; shift 4
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  local flayout=() mlayout=() extra=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do flayout+=("$1"); shift; done; shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do mlayout+=("$1"); shift; done; shift
  extra=("$@")
  fp8tron "$OUT/$name-fp8tron.log" "$franks" "${COMMON[@]}" "${extra[@]}" "${flayout[@]}"
  fp8tron "$OUT/$name-save.log" "$franks" "${COMMON[@]}" "${extra[@]}" "${flayout[@]}" --exit-interval 10 --save "$OUT/ckpt-$name" ||
    { echo "FAIL: $name: fp8tron's save failed ($OUT/$name-save.log)"; fail=1; return; }
  [ -f "$OUT/ckpt-$name/iter_0000010/.metadata" ] ||
    { echo "FAIL: $name: fp8tron did not write torch_dist (its notice is in $OUT/$name-save.log)"; fail=1; return; }
  megatron "$OUT/$name-megatron.log" "$mranks" "${COMMON[@]}" "${extra[@]}" "${mlayout[@]}" --load "$OUT/ckpt-$name" ||
    { echo "FAIL: $name: Megatron-LM failed ($OUT/$name-megatron.log)"; fail=1; return; }
  compare "$name" "$OUT/$name-fp8tron.log" "$OUT/$name-megatron.log" "$tol"
}

TP2PP2=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)
check fp32 1 1 1e-4 -- --
check bf16 1 1 1e-4 -- -- --bf16
check saved-tp2pp2-resumed-tp2 4 2 1e-4 "${TP2PP2[@]}" -- --tensor-model-parallel-size 2 --
check saved-1-resumed-tp2pp2 1 4 1e-4 -- "${TP2PP2[@]}" --
check llama 1 1 1e-4 -- -- "${LLAMA[@]}"
# (Multi-token prediction with rotary positions: Megatron-LM at d98e8a6 refuses it with the
# fixture's learned absolute positions, one of its two rules on MTP's position embeddings.)
MTP=(--mtp-num-layers 1 --position-embedding-type rope --no-rope-fusion)
check mtp 1 1 1e-4 -- -- "${MTP[@]}"
# More parameter groups, which Megatron matches to its own by position: the embedding and output
# layer's decoupled learning rate, and MuP's scaled learning rate and epsilon of the hidden matrices.
check decoupled-lr 1 1 1e-4 -- -- --decoupled-lr 5e-3 --decoupled-min-lr 1e-5 --untie-embeddings-and-output-weights
check mup 1 1 1e-4 -- -- --use-mup --mup-base-hidden-size 32
# Multi-latent attention with its latents' norms (Megatron's local MLA modules' names).
MLA=(--multi-latent-attention --q-lora-rank 32 --kv-lora-rank 16 --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16
     --qk-layernorm --position-embedding-type rope --rope-type rope --no-rope-fusion)
check mla 1 1 1e-4 -- -- "${MLA[@]}"
# torch.optim.SGD's momentum buffers and parameter groups (no step).
check sgd 1 1 1e-4 -- -- --optimizer sgd --sgd-momentum 0.9
MOE=(--num-experts 4 --moe-router-topk 2 --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 0.01 --swiglu
     --disable-bias-linear)
check moe-ep2 2 2 1e-4 --expert-model-parallel-size 2 -- --expert-model-parallel-size 2 -- "${MOE[@]}"
# A dense layer then an MoE layer (Megatron numbers such layers instead of stacking them), and the
# routers' expert bias (aux-loss-free balancing: sigmoid scores).
check moe-mixed-ep2 2 2 1e-4 --expert-model-parallel-size 2 -- --expert-model-parallel-size 2 -- "${MOE[@]}" \
  --moe-layer-freq "([0]+[1])"
check moe-bias-ep2 2 2 1e-4 --expert-model-parallel-size 2 -- --expert-model-parallel-size 2 -- "${MOE[@]}" \
  --moe-router-enable-expert-bias --moe-router-score-function sigmoid
# A multi-token-prediction layer that is an MoE layer (its experts stacked over the experts only).
check mtp-moe-ep2 2 2 1e-4 --expert-model-parallel-size 2 -- --expert-model-parallel-size 2 -- "${MOE[@]}" "${MTP[@]}"
# FP8 (delayed scaling, hybrid, bf16, Transformer Engine's layer names): fp8tron saves an FP8 run,
# with its FP8 recipe state under names of its own; Megatron-LM (here without Transformer Engine,
# so local layers, which take TE's fused norm names, and no FP8) resumes it in bf16, as fp8tron
# does with the FP8 flags dropped. fp8tron's own FP8 resume of that checkpoint prints its
# uninterrupted FP8 run's losses.
FP8=(--transformer-impl transformer_engine --bf16 --fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 16
     --fp8-amax-compute-algo max)
fp8_check() {
  local name=fp8-resumed-bf16
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  fp8tron "$OUT/$name-full.log" 1 "${COMMON[@]}" "${FP8[@]}" &&
    fp8tron "$OUT/$name-save.log" 1 "${COMMON[@]}" "${FP8[@]}" --exit-interval 10 --save "$OUT/ckpt-$name" &&
    fp8tron "$OUT/$name-fp8.log" 1 "${COMMON[@]}" "${FP8[@]}" --load "$OUT/ckpt-$name" &&
    fp8tron "$OUT/$name-fp8tron.log" 1 "${COMMON[@]}" --bf16 --load "$OUT/ckpt-$name" ||
    { echo "FAIL: $name: an fp8tron run failed ($OUT/$name-*.log)"; fail=1; return; }
  if [ "$(losses "$OUT/$name-fp8.log" | awk '$1 > 10' | wc -l)" = 4 ] &&
     diff <(losses "$OUT/$name-fp8.log" | awk '$1 > 10') <(losses "$OUT/$name-full.log" | awk '$1 > 10') > /dev/null; then
    echo "ok: $name: fp8tron's FP8 resume from torch_dist = its uninterrupted FP8 run"
  else
    echo "FAIL: $name: fp8tron's FP8 resume from torch_dist differs from its uninterrupted FP8 run"; fail=1
  fi
  megatron "$OUT/$name-megatron.log" 1 "${COMMON[@]}" --bf16 --load "$OUT/ckpt-$name" ||
    { echo "FAIL: $name: Megatron-LM failed ($OUT/$name-megatron.log)"; fail=1; return; }
  compare "$name" "$OUT/$name-fp8tron.log" "$OUT/$name-megatron.log" 1e-4
}
fp8_check
DISTOPT=(--use-distributed-optimizer)
check distopt-dp2 2 2 1e-4 "${DISTOPT[@]}" -- "${DISTOPT[@]}" --
check distopt-dp2-bf16 2 2 1e-4 "${DISTOPT[@]}" -- "${DISTOPT[@]}" -- --bf16
check distopt-dp2-resumed-tp2 2 2 1e-4 "${DISTOPT[@]}" -- "${DISTOPT[@]}" --tensor-model-parallel-size 2 --
exit $fail
