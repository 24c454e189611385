#!/usr/bin/env bash
# Tokens/s of this tree's fp8tron against another version's, raced in one run: for each model and
# precision (bf16, FP8 delayed hybrid) the base binary and this one train in turn. Shows whether a
# change moved the speed, within the run-to-run spread (docs/performance.md, "Spread").
#   scripts/bench_commits.sh BASE [model ...]
# BASE is a commit of this repository or a directory holding another version's source tree; it is
# built into $BENCH_BASE_BUILD (default /tmp/fp8tron-base-build). BENCH_ITERS (default 40: the
# figure is the last 20-iteration interval), BENCH_SIDES (default "base head"), BENCH_OUT for logs.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ $# -ge 1 ] || { echo "usage: scripts/bench_commits.sh BASE [model ...]" >&2; exit 2; }
base=$1
shift
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(gpt2-124m gpt-1.3b llama-style)
source .setup/env.sh
OUT=${BENCH_OUT:-bench-logs}
mkdir -p "$OUT"
BASE_BUILD=${BENCH_BASE_BUILD:-/tmp/fp8tron-base-build}

# The base version's source: a directory as given, or the commit unpacked beside its build.
if [ -d "$base" ]; then
  src=$(cd "$base" && pwd)
else
  src=$BASE_BUILD-src
  rm -rf "$src" && mkdir -p "$src"
  git archive "$base" | tar -x -C "$src"
fi
[ -e "$src/.setup" ] || ln -s "$ROOT/.setup" "$src/.setup"
(cd "$src" && FP8TRON_BUILD_DIR=$BASE_BUILD ./scripts/build.sh fp8tron) >"$OUT/base-build.log" 2>&1 ||
  { tail -5 "$OUT/base-build.log"; echo "the base version did not build; see $OUT/base-build.log" >&2; exit 1; }

last_interval() { grep "] iteration " "$1" | tail -1 | sed -n 's/.*tokens per second: \([0-9.]*\).*/\1/p'; }
echo "| model | precision | side | tokens/s | max allocated MB |"
echo "| --- | --- | --- | --- | --- |"
for m in "${models[@]}"; do
  for precision in bf16 fp8; do
    flags=()
    [ $precision = fp8 ] && flags=(--fp8-format hybrid --fp8-recipe delayed)
    for side in ${BENCH_SIDES:-base head}; do
      bin=./build/fp8tron
      [ "$side" = base ] && bin=$BASE_BUILD/fp8tron
      log="$OUT/commits-$m-$precision-$side.log"
      "$bin" --config "configs/$m.json" --train-iters "${BENCH_ITERS:-40}" --log-interval 20 --eval-iters 0 "${flags[@]}" \
        >"$log" 2>&1 || { echo "| $m | $precision | $side | failed: $(tail -1 "$log") | |"; continue; }
      mem=$(sed -n 's/.*max allocated: \([0-9.]*\).*/\1/p' "$log" | head -1)
      echo "| $m | $precision | $side | $(last_interval "$log") | $mem |"
    done
  done
done
