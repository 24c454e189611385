#!/usr/bin/env bash
# Megatron-LM's own test configurations (tests/cli/megatron_configs/*.args: the MODEL_ARGS of
# tests/functional_tests/test_cases/{gpt,moe}/*/model_config.yaml at Megatron-LM d98e8a6, data
# paths replaced by ${...} placeholders) through `fp8tron --dry-run` with the world size each names,
# on test data made here. Each must be accepted, or refused naming the flag of a feature fp8tron
# lacks (tests/cli/megatron_configs/expected.tsv). A dry run that exits 0 only when training would
# start; "not supported yet" makes it fail, so a refusal is always a non-zero exit.
#
# usage: megatron_configs_test.sh FP8TRON FP8TRON_PREPROCESS MAKE_TEST_DATA SOURCE_DIR
set -u
BIN=$1 PRE=$2 MAKE=$3 SRC=$4
DIR=$SRC/tests/cli/megatron_configs
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

source "$DIR/test_data.sh"

fail=0 checked=0
for f in "$DIR"/*.args; do
  name=$(basename "$f" .args)
  exp=$(awk -F'\t' -v n="$name" '$1 == n { print $2 "\t" $3 }' "$DIR/expected.tsv")
  if [ -z "$exp" ]; then echo "FAIL: $name has no expectation in expected.tsv"; fail=1; continue; fi
  kind=${exp%%$'\t'*} want=${exp#*$'\t'}
  ws=$(sed -n 's/^# world-size: \([0-9]*\).*/\1/p' "$f")
  if grep -q 'TOKENIZER_MODEL' "$f" && [ ! -f "$TOKENIZER_MODEL" ] && [ "$kind" = accept ]; then
    echo "skipped: $name (needs a SentencePiece model; built without the SentencePiece trainer)"; continue
  fi
  # One flag per line, shell-quoted: the shell splits the words and expands the placeholders.
  eval "args=($(grep -v '^#' "$f" | tr '\n' ' '))"
  out=$(WORLD_SIZE=$ws "$BIN" "${args[@]}" --dry-run 2>&1); rc=$?
  checked=$((checked + 1))
  case "$kind" in
    accept)
      if [ $rc -eq 0 ] && grep -q "dry run: configuration is valid" <<<"$out"; then
        echo "ok: $name accepted"
      else
        echo "FAIL: $name should be accepted, got rc $rc:"; grep -m3 'error\|warning' <<<"$out"; fail=1
      fi ;;
    refuse)
      # Named in the error line, or (flags of features not implemented yet) in the dry run's
      # "not supported yet" list that made it fail.
      named=$( { grep 'error' <<<"$out"; sed -n '/^not supported yet/,/^$/p' <<<"$out"; } | grep -cF -- "$want")
      if [ $rc -ne 0 ] && [ "$named" -gt 0 ]; then
        echo "ok: $name refused ($want)"
      else
        echo "FAIL: $name should be refused naming $want, got rc $rc:"; grep -m3 'error' <<<"$out"; fail=1
      fi ;;
    *) echo "FAIL: $name: unknown expectation '$kind'"; fail=1 ;;
  esac
done
[ $checked -ge 39 ] || { echo "FAIL: only $checked configurations checked"; fail=1; }
[ $fail = 0 ] && echo "megatron configs: all $checked as expected"
exit $fail
