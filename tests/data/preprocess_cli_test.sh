#!/usr/bin/env bash
# End-to-end check of fp8tron-preprocess: a NullTokenizer run writes the dataset files, and bad
# flags fail with status 1 and a one-line message.
set -euo pipefail
bin="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

printf '{"text": "1 2 3"}\n{"text": "4 5"}\n{"text": "6"}\n' > "$dir/in.jsonl"
"$bin" --input "$dir/in.jsonl" --output-prefix "$dir/out" --tokenizer-type NullTokenizer --vocab-size 100 \
  --append-eod --workers 2 > "$dir/stdout" 2> "$dir/stderr"
test -s "$dir/out_text_document.bin" && test -s "$dir/out_text_document.idx"
# 6 tokens + 3 eods, uint16 (vocabulary of 101 ids): 18 bytes.
test "$(stat -c %s "$dir/out_text_document.bin")" -eq 18
grep -q "3 documents, 9 tokens" "$dir/stdout"

status=0
"$bin" --input "$dir/in.jsonl" --output-prefix "$dir/x" --tokenizer-type NullTokenizer --vocab-size 100 \
  --worker 2 2> "$dir/err" || status=$?
test "$status" -eq 1
grep -q "unknown argument --worker, did you mean --workers?" "$dir/err"

status=0
"$bin" --input "$dir/missing.jsonl" --output-prefix "$dir/x" --tokenizer-type NullTokenizer --vocab-size 100 \
  2> "$dir/err" || status=$?
test "$status" -eq 1
grep -q "error: cannot open --input" "$dir/err"

# A directory or an empty file is refused without writing a dataset.
for input in "$dir" "$dir/empty.jsonl"; do
  : > "$dir/empty.jsonl"
  status=0
  "$bin" --input "$input" --output-prefix "$dir/e" --tokenizer-type NullTokenizer --vocab-size 100 \
    2> "$dir/err" || status=$?
  test "$status" -eq 1
  grep -Eq "error: --input .* (is a directory|holds no documents)" "$dir/err"
  if ls "$dir"/e_* > /dev/null 2>&1; then echo "a refused input left files behind"; exit 1; fi
done
# More --workers than the system can start threads for (the address space capped so that their
# stacks do not fit): one line, the threads already started joined, nothing written.
status=0
(ulimit -s 8192 && ulimit -v 6000000 && exec "$bin" --input "$dir/in.jsonl" --output-prefix "$dir/t" --tokenizer-type NullTokenizer \
  --vocab-size 100 --workers 2000) > /dev/null 2> "$dir/err" || status=$?
test "$status" -eq 1
grep -q "error: could not start the 2001 tokenizer threads of --workers 2000 (.*): pass fewer --workers" "$dir/err"
test "$(grep -c error "$dir/err")" -eq 1
if ls "$dir"/t_* > /dev/null 2>&1; then echo "a refused run left files behind"; exit 1; fi
echo "preprocess CLI: ok"
