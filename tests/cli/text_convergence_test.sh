#!/usr/bin/env bash
# scripts/text_corpus/fp8_convergence.sh, shrunk onto the CPU: a small corpus tokenized by
# fp8tron-preprocess with a byte-level vocabulary, two iterations of a tiny model per run. bf16, an
# FP8 recipe and a run named with flags of its own (NAME=FLAGS) must each reach the final
# validation loss and be listed in the table with it; the named run's flags must reach its command
# line (its log prints them); a malformed name is refused before anything runs.
# Usage: text_convergence_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
SRC=$1
BUILD=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
ln -s "$BUILD" build
ln -s "$SRC/scripts" scripts
mkdir -p .setup corpus && ln -s "$SRC/.setup/env.sh" .setup/env.sh
source .setup/env.sh
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }

"$FP8TRON_PYTHON" - <<'PY'
import json, random
random.seed(1)
words = "the model trains on documents of packaged text with eight bit floats and checks its loss".split()
with open("docs.jsonl", "w") as f:
    for _ in range(300):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(40))}) + "\n")
PY
"$FP8TRON_PYTHON" "$SRC/tests/cli/make_byte_vocab.py" corpus/gpt2-vocab.json corpus/gpt2-merges.txt
./build/fp8tron-preprocess --input docs.jsonl --output-prefix corpus/docs --tokenizer-type GPT2BPETokenizer \
  --vocab-file corpus/gpt2-vocab.json --merge-file corpus/gpt2-merges.txt --append-eod >preprocess.log 2>&1 ||
  fail "fp8tron-preprocess: $(tail -1 preprocess.log)"

export OUT=$WORK/out ITERS=2 GLOBAL_BATCH=2 WARMUP=1 CONCURRENT=2
export EXTRA_FLAGS="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --eval-interval 2 --eval-iters 1 --log-interval 1 --device cpu"
table=$(scripts/text_corpus/fp8_convergence.sh corpus bf16 delayed 'bf16-other-seed=--seed 4321' 2>&1)
rc=$?
echo "$table"
# Exit status 1 says a recipe ended more than 0.25% from bf16, as two iterations may; 2 is an error.
[ $rc -le 1 ] || fail "the script exited with $rc"
for run in bf16 delayed bf16-other-seed; do
  grep -qE "^\| $run \| [0-9.]+E[+-][0-9]+ \| .* \| [0-9.]+ \|$" <<<"$table" ||
    fail "no final validation loss or tokens/s for '$run' in the table"
done
grep -q "seed \.* 4321" "$OUT/bf16-other-seed.log" || fail "the named run's --seed 4321 did not reach its command line"
grep -q "seed \.* 1234" "$OUT/bf16.log" || fail "bf16 did not keep the common --seed 1234"
out=$(scripts/text_corpus/fp8_convergence.sh corpus 'bad name=--seed 1' 2>&1)
[ $? -eq 2 ] && grep -q "a run's name is letters" <<<"$out" || fail "a malformed run name was not refused: $out"
echo "text convergence script: all runs listed"
