#!/usr/bin/env bash
# Real-text FP8 convergence: GPT-2 124M on the packaged documentation corpus
# (scripts/text_corpus/prepare_corpus.py: Linux, Python and Perl documentation, GPT-2 BPE), bf16
# and each FP8 recipe from the same seed and data, 5000 steps of 16 x 1024 tokens, validation loss
# every 500 steps on a held-out 2% split. TensorBoard event files (loss, validation loss, and with
# --log-fp8-stats-to-tensorboard each FP8 linear's per-tensor amax, underflow and overflow counts
# every 100 steps) go to $OUT/tb/<recipe>. Prints the final validation loss of each recipe and its
# difference from bf16 (bar: within 0.25%, DeepSeek-V3's).
#
# usage: scripts/text_corpus/fp8_convergence.sh CORPUS_DIR [recipe ...]
#   recipes: bf16 delayed tensorwise blockwise mxfp8 (default: all; run them in several calls when
#   one call's time is limited: each takes about 5 minutes on one H100/H200); a run whose log
#   already ends with its final validation loss is not repeated, so the last call prints the table.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
source .setup/env.sh
CORPUS=$(cd "$1" && pwd)
shift
OUT=${OUT:-convergence-text}
mkdir -p "$OUT"
RECIPES=("$@")
[ ${#RECIPES[@]} -eq 0 ] && RECIPES=(bf16 delayed tensorwise blockwise mxfp8)
ITERS=${ITERS:-5000}
for recipe in "${RECIPES[@]}"; do
  log="$OUT/$recipe.log"
  grep -q "validation loss at iteration $ITERS " "$log" 2>/dev/null && continue
  fp8=()
  case $recipe in
    bf16) ;;
    blockwise) fp8=(--fp8-format e4m3 --fp8-recipe blockwise) ;;
    *) fp8=(--fp8-format hybrid --fp8-recipe "$recipe") ;;
  esac
  ./build/fp8tron --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 \
    --max-position-embeddings 1024 --micro-batch-size 16 --global-batch-size 16 --bf16 \
    --data-path "$CORPUS/docs_text_document" --split 98,2,0 --data-cache-path "$OUT/cache" \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$CORPUS/gpt2-vocab.json" --merge-file "$CORPUS/gpt2-merges.txt" \
    --train-iters "$ITERS" --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 200 \
    --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --attention-dropout 0 --hidden-dropout 0 --seed 1234 \
    --log-interval 100 --log-throughput --eval-interval 500 --eval-iters 10 \
    --tensorboard-dir "$OUT/tb/$recipe" --tensorboard-log-interval 100 --log-validation-ppl-to-tensorboard \
    --log-fp8-stats-to-tensorboard "${fp8[@]}" >"$log" 2>&1 || echo "!! $recipe failed: $(tail -1 "$log")"
done
echo "| recipe | validation loss at $ITERS | vs bf16 | tokens/s (last log line) |"
echo "| --- | --- | --- | --- |"
base=$(sed -n "s/.*validation loss at iteration $ITERS .*lm loss value: \([0-9.E+-]*\).*/\1/p" "$OUT/bf16.log" 2>/dev/null | tail -1)
status=0
for recipe in bf16 delayed tensorwise blockwise mxfp8; do
  [ -f "$OUT/$recipe.log" ] || continue
  v=$(sed -n "s/.*validation loss at iteration $ITERS .*lm loss value: \([0-9.E+-]*\).*/\1/p" "$OUT/$recipe.log" | tail -1)
  tps=$(grep " iteration " "$OUT/$recipe.log" | tail -1 | sed -n 's/.*tokens per second: \([0-9.]*\).*/\1/p')
  if [ -z "$v" ]; then echo "| $recipe | not finished | | $tps |"; status=1; continue; fi
  diff=""
  if [ -n "$base" ]; then
    diff=$(python3 -c "d=100*($v-$base)/$base; print(f'{d:+.3f}%' + (' (over 0.25%)' if abs(d) > 0.25 else ''))")
    [[ $diff == *over* ]] && status=1
  fi
  echo "| $recipe | $v | $diff | $tps |"
done
exit $status
