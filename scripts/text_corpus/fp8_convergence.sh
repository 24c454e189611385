#!/usr/bin/env bash
# Real-text FP8 convergence: GPT-2 124M (MODEL=gpt2, 5000 steps) or the Mixtral-style MoE model
# shrunk to 8 layers of hidden size 768 with 8 experts of 2048, top-2 (MODEL=moe, 2000 steps) on
# the packaged documentation corpus (scripts/text_corpus/prepare_corpus.py: Linux, Python and Perl
# documentation, GPT-2 BPE), bf16 and each FP8 recipe from the same seed and data, ITERS steps of
# GLOBAL_BATCH (default 8) x 1024 tokens, validation loss every 250 steps on a held-out 2% split. TensorBoard event files (loss,
# validation loss, and with --log-fp8-stats-to-tensorboard each FP8 linear's per-tensor amax,
# underflow and overflow counts every 100 steps) go to $OUT/tb/<recipe>. Prints the final
# validation loss of each recipe and its difference from bf16 (bar: within 0.25%, DeepSeek-V3's);
# scripts/text_corpus/plot_convergence.py draws the curves from the logs.
#
# usage: scripts/text_corpus/fp8_convergence.sh CORPUS_DIR [recipe ...]
#   recipes: bf16 delayed tensorwise blockwise mxfp8 hif8 (default: all; the FP8 ones in their
#   usual format: hybrid, blockwise e4m3, HiF8 tensorwise), and delayed-e4m3 tensorwise-e4m3
#   (gradients in E4M3 too); or NAME=FLAGS, a run of its own with those flags after the common ones
#   (e.g. 'bf16-seed2=--seed 4321' for how far two bf16 runs end apart, or 'delayed-bf16-wgrad=
#   --fp8-format hybrid --fp8-recipe delayed --no-fp8-wgrad'). CONCURRENT=N runs N of
#   them at a time on the GPU (the runs do not depend on each other; their tokens/s then are not a
#   speed figure). A run whose log already ends with its final validation loss is not repeated, so
#   the runs can be split over several invocations and the last one prints the whole table.
#   EXTRA_FLAGS are added to every run (e.g. --dry-run to check the flags without training).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
source .setup/env.sh
CORPUS=$(cd "$1" && pwd)
shift
MODEL=${MODEL:-gpt2}
case $MODEL in
  gpt2)
    MODEL_FLAGS=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --position-embedding-type learned_absolute)
    DEFAULT_ITERS=5000 ;;
  moe)
    MODEL_FLAGS=(--num-layers 8 --hidden-size 768 --num-attention-heads 12 --group-query-attention --num-query-groups 4
                 --ffn-hidden-size 2048 --num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss
                 --moe-aux-loss-coeff 0.01 --moe-router-dtype fp32 --moe-token-dispatcher-type alltoall --moe-grouped-gemm
                 --moe-permute-fusion --position-embedding-type rope --normalization RMSNorm --swiglu
                 --disable-bias-linear --untie-embeddings-and-output-weights)
    DEFAULT_ITERS=2000 ;;
  *) echo "MODEL must be gpt2 or moe, not '$MODEL'" >&2; exit 2 ;;
esac
OUT=${OUT:-convergence-text-$MODEL}
mkdir -p "$OUT"
ALL=(bf16 delayed tensorwise blockwise mxfp8 hif8)
RECIPES=("$@")
[ ${#RECIPES[@]} -eq 0 ] && RECIPES=("${ALL[@]}")
TABLE=("${ALL[@]}" delayed-e4m3 tensorwise-e4m3)
ITERS=${ITERS:-$DEFAULT_ITERS}
GLOBAL_BATCH=${GLOBAL_BATCH:-8}
CONCURRENT=${CONCURRENT:-1}
final_line="validation loss at iteration $ITERS "

declare -A CUSTOM_FLAGS=()
recipe_flags() {
  if [ -n "${CUSTOM_FLAGS[$1]+set}" ]; then echo "${CUSTOM_FLAGS[$1]}"; return; fi
  case $1 in
    bf16) ;;
    blockwise) echo --fp8-format e4m3 --fp8-recipe blockwise ;;
    hif8) echo --fp8-format hif8 --fp8-recipe tensorwise ;;
    delayed | tensorwise | mxfp8) echo --fp8-format hybrid --fp8-recipe "$1" ;;
    delayed-e4m3 | tensorwise-e4m3) echo --fp8-format e4m3 --fp8-recipe "${1%-e4m3}" ;;
    *) echo "unknown recipe '$1' (one of: ${ALL[*]})" >&2; exit 2 ;;
  esac
}

train() {
  local recipe=$1 log="$OUT/$1.log"
  # shellcheck disable=SC2046
  ./build/fp8tron "${MODEL_FLAGS[@]}" --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size "$GLOBAL_BATCH" --global-batch-size "$GLOBAL_BATCH" --bf16 \
    --data-path "$CORPUS/docs_text_document" --split 98,2,0 --data-cache-path "$OUT/cache/$recipe" \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$CORPUS/gpt2-vocab.json" --merge-file "$CORPUS/gpt2-merges.txt" \
    --train-iters "$ITERS" --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters "${WARMUP:-200}" \
    --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --attention-dropout 0 --hidden-dropout 0 --seed 1234 \
    --log-interval 50 --log-throughput --eval-interval 250 --eval-iters 40 \
    --tensorboard-dir "$OUT/tb/$recipe" --tensorboard-log-interval 100 --log-validation-ppl-to-tensorboard \
    --log-fp8-stats-to-tensorboard $(recipe_flags "$recipe") ${EXTRA_FLAGS:-} >"$log" 2>&1 ||
    echo "!! $recipe failed: $(tail -1 "$log")"
}

for i in "${!RECIPES[@]}"; do
  spec=${RECIPES[$i]}
  if [[ $spec == *=* ]]; then
    name=${spec%%=*}
    [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "a run's name is letters, digits and ._- only, not '$name'" >&2; exit 2; }
    CUSTOM_FLAGS[$name]=${spec#*=}
    RECIPES[$i]=$name
    TABLE+=("$name")
  fi
done
for recipe in "${RECIPES[@]}"; do recipe_flags "$recipe" >/dev/null || exit 2; done
running=0
for recipe in "${RECIPES[@]}"; do
  grep -q "$final_line" "$OUT/$recipe.log" 2>/dev/null && continue
  train "$recipe" &
  running=$((running + 1))
  if [ "$running" -ge "$CONCURRENT" ]; then wait -n; running=$((running - 1)); fi
done
wait

final_loss() { sed -n "s/.*$final_line.*lm loss value: \([0-9.E+-]*\).*/\1/p" "$OUT/$1.log" 2>/dev/null | tail -1; }
echo "| recipe | validation loss at $ITERS | vs bf16 | tokens/s (last log line) |"
echo "| --- | --- | --- | --- |"
base=$(final_loss bf16)
status=0
for recipe in "${TABLE[@]}"; do
  [ -f "$OUT/$recipe.log" ] || continue
  v=$(final_loss "$recipe")
  tps=$(grep "\] iteration " "$OUT/$recipe.log" | tail -1 | sed -n 's/.*tokens per second: \([0-9.]*\).*/\1/p')
  if [ -z "$v" ]; then echo "| $recipe | not finished | | $tps |"; status=1; continue; fi
  diff=""
  if [ -n "$base" ]; then
    diff=$(python3 -c "d=100*($v-$base)/$base; print(f'{d:+.3f}%' + (' (over 0.25%)' if abs(d) > 0.25 else ''))")
    [[ $diff == *over* ]] && status=1
  fi
  echo "| $recipe | $v | $diff | $tps |"
done
exit $status
