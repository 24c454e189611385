#!/usr/bin/env bash
# Checkpoint speed (issue 6 targets: >= 1 GB/s per rank to local disk for the 1.3B model with
# optimizer state; with --async-save training blocked < 1 s per save) and exact resume on this
# machine's GPU. Usage: scripts/bench_checkpoint.sh [model (default gpt-1.3b)] [-- extra flags]
# CKPT_DIR (default /tmp/fp8tron-bench-ckpt) must be on the local disk to measure; it is removed.
# BUILD: the build directory (default build).
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
run() {  # run <log> flags...
  local log=$1; shift
  "${BUILD:-build}/fp8tron" --config "configs/$model.json" --eval-iters 0 --log-interval 5 --lr-decay-iters 1000 "${extra[@]}" "$@" >"$log" 2>&1 || {
    echo "failed: $(tail -1 "$log")"; exit 1; }
}
rm -rf "$DIR"
run "$OUT/ckpt-sync.log" --train-iters 6 --save "$DIR/sync" --save-interval 3
echo "synchronous saves (rank 0):"
grep "checkpoint save took" "$OUT/ckpt-sync.log" | sed 's/^/  /'
du -sh "$DIR/sync/iter_0000006" | sed 's/^/  checkpoint size: /'
# Exact resume: 6 straight vs 3 + load + 3 (the losses of iterations 4..6 must agree).
run "$OUT/ckpt-straight.log" --train-iters 6 --log-interval 1
run "$OUT/ckpt-resume.log" --train-iters 6 --log-interval 1 --load "$DIR/sync" --ckpt-step 3
straight=$(grep -E " iteration +[456]/" "$OUT/ckpt-straight.log" | sed 's/.*lm loss: \([^ ]*\).*/\1/')
resumed=$(grep -E " iteration +[456]/" "$OUT/ckpt-resume.log" | sed 's/.*lm loss: \([^ ]*\).*/\1/')
echo "losses of iterations 4-6 straight: $(echo $straight) resumed: $(echo $resumed) ->" \
  "$([ "$straight" = "$resumed" ] && echo identical || echo DIFFERENT)"
rm -rf "$DIR/sync"  # a 1.3B checkpoint with optimizer state is 18 GB: make room
run "$OUT/ckpt-async.log" --train-iters 6 --save "$DIR/async" --save-interval 3 --async-save
echo "asynchronous saves:"
grep -E "training blocked|checkpoint save took" "$OUT/ckpt-async.log" | sed 's/^/  /'
rm -rf "$DIR"
