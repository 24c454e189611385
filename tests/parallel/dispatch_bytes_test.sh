#!/usr/bin/env bash
# The MoE dispatch all-to-all's bytes per iteration, as the trainer measures and reports them
# (--timing-log-level 1, "moe-dispatch-all-to-all"), with and without --moe-dispatch-fp8: EP2, the
# alltoall dispatcher, FP8 blockwise experts, bf16 activations, hidden 128. The first iteration
# routes the same tokens either way (its forward is bitwise the same), so on every rank the FP8
# run must send exactly (H + 4 ceil(H / 128)) / (2 H) = 132 / 256 of the bf16 run's bytes.
#
#   dispatch_bytes_test.sh <launcher and its arguments...> -- <fp8tron> [flags...]
# e.g. mpirun -np 2 ... -- build/fp8tron --device cpu, or tests/parallel/nccl_launch.sh mpirun 2 --
# build/fp8tron --device cuda (exits 77, skipped, where that launcher finds no GPU).
set -uo pipefail
launch=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  launch+=("$1")
  shift
done
[ $# -ge 2 ] || { echo "usage: $0 <launcher...> -- <fp8tron> [flags...]" >&2; exit 2; }
shift
program=$1
shift
flags=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
       --global-batch-size 4 --train-iters 1 --lr 1e-3 --vocab-size 128 --builtin-data --bf16 --num-experts 4
       --moe-router-topk 2 --moe-ffn-hidden-size 64 --moe-layer-freq 1 --expert-model-parallel-size 2
       --moe-token-dispatcher-type alltoall --fp8-format e4m3 --fp8-recipe blockwise --timing-log-level 1
       --timing-log-option all --log-interval 1 --eval-iters 0 "$@")

# Every rank's bytes of the first iteration, one per line, from the "all" form of the report:
#   bytes per iteration across ranks:
#     moe-dispatch-all-to-all:
#        rank  0: 1234
run_bytes() {
  local out rc
  out=$("${launch[@]}" "$program" "${flags[@]}" "$@" 2>&1)
  rc=$?
  if [ $rc = 77 ]; then echo "$out"; exit 77; fi
  if [ $rc != 0 ]; then
    echo "$out" >&2
    echo "FAIL: fp8tron $* exited with $rc" >&2
    exit 1
  fi
  echo "$out" | awk '/^ *moe-dispatch-all-to-all:/ { on = 1; next } on && /rank/ { print $3; next } { on = 0 }'
}

bf16=$(run_bytes) || exit $?
fp8=$(run_bytes --moe-dispatch-fp8) || exit $?
echo "bf16 dispatch bytes per rank: $(echo $bf16)"
echo "FP8 dispatch bytes per rank:  $(echo $fp8)"
[ "$(echo "$bf16" | wc -w)" = 2 ] || { echo "FAIL: expected 2 ranks' bytes without the flag"; exit 1; }
[ "$(echo "$fp8" | wc -w)" = 2 ] || { echo "FAIL: expected 2 ranks' bytes with the flag"; exit 1; }
paste <(echo "$bf16") <(echo "$fp8") | while read -r b f; do
  if [ "$b" -le 0 ] || [ $((f * 256)) != $((b * 132)) ]; then
    echo "FAIL: $f bytes with --moe-dispatch-fp8 against $b without: not 132/256 of them"
    exit 1
  fi
  awk -v b="$b" -v f="$f" 'BEGIN { printf "ratio %.4f (132/256 = 0.5156)\n", f / b }'
done || exit 1
echo "PASS"
