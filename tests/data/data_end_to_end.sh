#!/usr/bin/env bash
# Preprocess a small JSONL corpus with fp8tron-preprocess, train on it with --data-path, and check
# that the loss falls and validation runs on the valid split.
set -euo pipefail
TRAIN=$1 PREPROCESS=$2
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
# Documents of counting numbers (NullTokenizer ids), from random starts: next = previous + 1.
awk 'BEGIN { srand(7); for (d = 0; d < 400; d++) { n = 20 + int(rand() * 60); k = int(rand() * 90); s = "";
      for (i = 0; i < n; i++) s = s (i ? " " : "") ((k + i) % 100);
      printf "{\"text\": \"%s\"}\n", s } }' > "$DIR/corpus.jsonl"
"$PREPROCESS" --input "$DIR/corpus.jsonl" --output-prefix "$DIR/corpus" --tokenizer-type NullTokenizer --vocab-size 128 \
  --append-eod --workers 2 > "$DIR/preprocess.log" 2>&1
test -s "$DIR/corpus_text_document.bin" && test -s "$DIR/corpus_text_document.idx"
"$TRAIN" --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --micro-batch-size 8 --global-batch-size 16 \
  --train-iters 80 --lr 3e-3 --lr-decay-style cosine --lr-warmup-iters 5 --data-path "$DIR/corpus_text_document" \
  --split 90,10,0 --tokenizer-type NullTokenizer --vocab-size 128 --eod-mask-loss --log-interval 10 --eval-interval 40 \
  --eval-iters 2 --device cpu --data-cache-path "$DIR/cache" --attention-dropout 0 --hidden-dropout 0 > "$DIR/train.log" 2>&1 \
  || { tail -5 "$DIR/train.log"; exit 1; }
first=$(grep -m1 " iteration " "$DIR/train.log" | sed -n 's/.*lm loss: \([0-9.E+-]*\).*/\1/p')
last=$(grep " iteration " "$DIR/train.log" | tail -1 | sed -n 's/.*lm loss: \([0-9.E+-]*\).*/\1/p')
grep -q "validation loss at iteration 40" "$DIR/train.log" || { echo "no validation line"; exit 1; }
grep -q "consumed samples:         1280" "$DIR/train.log" || { echo "consumed samples not reported as Megatron does"; exit 1; }
# A second run reuses the cached indices.
ls "$DIR/cache" | grep -q . || { echo "no cached indices"; exit 1; }
awk -v a="$first" -v b="$last" 'BEGIN { if (b < a - 1.5) { print "loss " a " -> " b ": falls"; exit 0 } print "loss did not fall: " a " -> " b; exit 1 }'
