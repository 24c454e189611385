#!/usr/bin/env bash
# --fim-data end to end on the CPU: a byte-level BPE vocabulary holding the FIM tokens (StarCoder's
# names, given with --fim-*-token), a small code corpus preprocessed with fp8tron-preprocess, a run
# that rewrites most documents (those starting with a "#" comment are left alone: --fim-no-prefix)
# and must learn, and the refusals a configuration gets before anything is built.
set -euo pipefail
TRAIN=$1 PREPROCESS=$2 PYTHON=${3:-python3}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
# GPT-2's byte symbols, a few merges, then the special tokens.
"$PYTHON" - "$DIR" <<'PY'
import json, sys
d = sys.argv[1]
# The standard construction (bytes_to_unicode).
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
sym = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {sym[b]: b for b in range(256)}
merges = []
for a, b in [("d", "e"), ("de", "f"), ("Ġ", "x"), ("r", "e"), ("re", "t"), ("u", "r"), ("ur", "n"), ("Ġ", "=")]:
    merges.append(f"{a} {b}"); vocab[a + b] = len(vocab)
for t in ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<file_sep>"]:
    vocab[t] = len(vocab)
json.dump(vocab, open(f"{d}/vocab.json", "w"))
open(f"{d}/merges.txt", "w").write("#version: 0.2\n" + "\n".join(merges) + "\n")
with open(f"{d}/corpus.jsonl", "w") as f:
    for i in range(300):
        a, b = i % 7, (i * 3) % 11
        text = ("# kept as it is\n" if i % 3 == 0 else "") + f"def f{a}(x):\n    return x + {b}\n\ndef g{b}(y):\n    return y * {a}\n"
        f.write(json.dumps({"text": text}) + "\n")
PY
"$PREPROCESS" --input "$DIR/corpus.jsonl" --output-prefix "$DIR/code" --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$DIR/vocab.json" --merge-file "$DIR/merges.txt" --append-eod --workers 1 > "$DIR/preprocess.log" 2>&1
COMMON=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64
        --micro-batch-size 8 --global-batch-size 16 --lr 3e-3 --lr-decay-style cosine --lr-warmup-iters 5
        --data-path "$DIR/code_text_document" --split 90,10,0 --tokenizer-type GPT2BPETokenizer
        --vocab-file "$DIR/vocab.json" --merge-file "$DIR/merges.txt" --device cpu --data-cache-path "$DIR/cache"
        --attention-dropout 0 --hidden-dropout 0 --log-interval 10 --eval-interval 30 --eval-iters 2
        --fim-data --fim-rate 0.9 --fim-spm-rate 0.5 --fim-prefix-token '<fim_prefix>' --fim-middle-token '<fim_middle>'
        --fim-suffix-token '<fim_suffix>' --fim-pad-token '<fim_pad>' --fim-no-prefix '#')
"$TRAIN" "${COMMON[@]}" --train-iters 60 > "$DIR/train.log" 2>&1 || { tail -5 "$DIR/train.log"; exit 1; }
if grep -q "is not in the GPT2BPETokenizer vocabulary" "$DIR/train.log"; then
  echo "the FIM tokens are in the vocabulary, yet a fallback was reported"; exit 1
fi
grep -q "validation loss at iteration 30" "$DIR/train.log" || { echo "no validation line"; exit 1; }
first=$(grep -m1 " iteration .*lm loss: " "$DIR/train.log" | sed -n 's/.*lm loss: \([0-9.E+-]*\).*/\1/p')
last=$(grep " iteration .*lm loss: " "$DIR/train.log" | tail -1 | sed -n 's/.*lm loss: \([0-9.E+-]*\).*/\1/p')
awk -v a="$first" -v b="$last" 'BEGIN { if (a != "" && b != "" && b < a - 1.0) { print "loss " a " -> " b ": falls"; exit 0 }
                                         print "loss did not fall: " a " -> " b; exit 1 }'

# Refused before anything is built, in one line naming the flag.
refused() {  # refused <text> <flags...>
  local want=$1; shift
  if out=$("$TRAIN" "${COMMON[@]}" --train-iters 10 "$@" --dry-run 2>&1); then echo "accepted: $*"; exit 1; fi
  grep -qF -- "$want" <<<"$out" || { echo "refusal of [$*] does not say [$want]:"; tail -2 <<<"$out"; exit 1; }
  [ "$(grep -c 'error' <<<"$out")" -le 1 ] || { echo "more than one error line for [$*]"; exit 1; }
}
refused "--fim-split-sample needs --fim-fragment-rate" --fim-split-sample '<file_sep>'
refused "--fim-spm-rate 2 is not a probability" --fim-spm-rate 2
refused "GPT2BPETokenizer, HuggingFaceTokenizer or TikTokenizer" --tokenizer-type NullTokenizer --vocab-size 300
# A token missing from GPT-2's vocabulary is its "<|endoftext|>", as in Megatron, with a warning.
out=$("$TRAIN" "${COMMON[@]}" --train-iters 10 --fim-middle-token '<middle>' --dry-run 2>&1) || { echo "$out" | tail -3; exit 1; }
grep -qF -- '--fim-middle-token "<middle>" is not in the GPT2BPETokenizer vocabulary, so it is the unknown token' <<<"$out" ||
  { echo "no warning for a missing FIM token"; exit 1; }
echo "fim end to end: passed"
