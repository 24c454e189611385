#!/usr/bin/env bash
# Checkpoints on this machine's GPU (what to expect: >= 1 GB/s per rank to local disk for the
# 1.3B model with optimizer state; with --async-save training blocked < 1 s per save, the first
# included; with --deterministic-mode bitwise repeatable training and resume).
#   1. --deterministic-mode: 20 iterations straight, saving at 10 and 20 (synchronous saves: their
#      speed), vs resuming from the iteration-10 checkpoint for 10 more; and a second straight run.
#      Bitwise: the losses of every iteration (as logged) and the iteration-20 shard files (sha256:
#      weights, fp32 main weights, Adam moments, step).
#   2. --async-save (default mode), saves at 10 and 20: how long training was blocked at each, the
#      first included; its iteration times and losses also show what deterministic mode costs.
# Usage: scripts/bench_checkpoint.sh [model (default gpt-1.3b)] [-- extra flags]
# CKPT_DIR (default /tmp/fp8tron-bench-ckpt) must be on the local disk to measure; it is removed
# (peak use: two checkpoints, 36 GB for the 1.3B model). BUILD: the build directory (default
# build). Logs go to $BENCH_OUT (default bench-logs); the summary also to $BENCH_OUT/checkpoint-summary.txt.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source .setup/env.sh
model=${1:-gpt-1.3b}; [ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
extra=("$@")
DIR=${CKPT_DIR:-/tmp/fp8tron-bench-ckpt}
OUT=${BENCH_OUT:-bench-logs}
mkdir -p "$OUT"
SUMMARY=$OUT/checkpoint-summary.txt
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
run() {  # run <log> flags...
  local log=$1; shift
  "${BUILD:-build}/fp8tron" --config "configs/$model.json" --eval-iters 0 --log-interval 1 --lr-decay-iters 1000 \
    --train-iters 20 "${extra[@]}" "$@" >"$log" 2>&1 || { say "failed: $(tail -1 "$log")"; exit 1; }
}
losses() {  # losses <log> <first> <last>: the logged lm loss of those iterations, one line
  awk -v a="$2" -v b="$3" '/ iteration +[0-9]+\// && match($0, /lm loss: [^ ]+/) {
       v = substr($0, RSTART, RLENGTH); sub(/.*: /, "", v); split($0, f, " iteration +"); it = f[2] + 0;
       if (it >= a && it <= b) printf "%s ", v }' "$1"
}
ms_per_iteration() {  # the mean of the logged per-iteration times from iteration 3 on
  awk '/ iteration +[0-9]+\// && match($0, /per iteration \(ms\): [0-9.]+/) { v = substr($0, RSTART, RLENGTH);
       sub(/.*: /, "", v); if (++it >= 3) { s += v; n++ } } END { if (n) printf "%.0f", s / n }' "$1"
}
shard_hash() { (cd "$1" && sha256sum rank_*.safetensors) | sha256sum | cut -c1-16; }  # names, not paths
same() { [ "$1" = "$2" ] && echo identical || echo DIFFERENT; }

rm -rf "$DIR"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
say "== checkpoints of $model on ${gpu:-the CPU} ($(git rev-parse --short HEAD))"
# 1. Deterministic mode: straight (saving at 10 and 20), resumed from 10, and a second straight run.
D=(--deterministic-mode)
run "$OUT/ckpt-det-straight.log" "${D[@]}" --save "$DIR/det" --save-interval 10
say "synchronous saves (rank 0):"
grep "checkpoint save took" "$OUT/ckpt-det-straight.log" | sed 's/^ */  /' | tee -a "$SUMMARY"
say "  checkpoint size: $(du -sh "$DIR/det/iter_0000010" | cut -f1)"
straight_hash=$(shard_hash "$DIR/det/iter_0000020")
rm -rf "$DIR/det/iter_0000020"  # keep the disk to two checkpoints
run "$OUT/ckpt-det-resumed.log" "${D[@]}" --load "$DIR/det" --ckpt-step 10 --save "$DIR/det-resumed"
resumed_hash=$(shard_hash "$DIR/det-resumed/iter_0000020")
rm -rf "$DIR/det" "$DIR/det-resumed"
run "$OUT/ckpt-det-again.log" "${D[@]}"
# 2. Asynchronous saves at 10 and 20 (default mode): training blocked at each, the first included.
run "$OUT/ckpt-async.log" --save "$DIR/async" --save-interval 10 --async-save
rm -rf "$DIR"
say "--deterministic-mode: $(grep -m1 -o 'attention: .*' "$OUT/ckpt-det-straight.log")"
say "  ms per iteration: $(ms_per_iteration "$OUT/ckpt-det-again.log") deterministic," \
    "$(ms_per_iteration "$OUT/ckpt-async.log") default ($(grep -m1 -o 'attention: .*' "$OUT/ckpt-async.log"))"
a=$(losses "$OUT/ckpt-det-straight.log" 1 20); b=$(losses "$OUT/ckpt-det-again.log" 1 20)
say "  run to run, losses of iterations 1-20: $(same "$a" "$b")"
a=$(losses "$OUT/ckpt-det-straight.log" 11 20); b=$(losses "$OUT/ckpt-det-resumed.log" 11 20)
say "  20 straight vs 10 + save + load + 10: losses of 11-20 $(same "$a" "$b") ($(echo $a | cut -d' ' -f10) vs" \
    "$(echo $b | cut -d' ' -f10) at 20); iteration-20 shard files $(same "$straight_hash" "$resumed_hash")" \
    "(sha256 $straight_hash vs $resumed_hash)"
d=$(losses "$OUT/ckpt-async.log" 1 20); a=$(losses "$OUT/ckpt-det-straight.log" 1 20)
say "  default vs deterministic mode, losses of 1-20: $(same "$d" "$a") (at 20: $(echo $d | cut -d' ' -f20) vs" \
    "$(echo $a | cut -d' ' -f20))"
say "asynchronous saves (default mode, iterations 10 and 20):"
grep -E "reserved in the background:|training blocked|checkpoint save took" "$OUT/ckpt-async.log" | sed 's/^ *>* */  /' |
  tee -a "$SUMMARY"
