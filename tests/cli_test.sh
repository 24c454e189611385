#!/usr/bin/env bash
# End-to-end checks of the executable: what users see for good and bad command lines.
set -u
BIN=$1
SRC=$2
fail=0
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 --lr 1e-3
      --train-iters 4 --vocab-size 64 --builtin-data --log-interval 2 --eval-iters 1 --eval-interval 4 --device cpu)

expect() {  # expect <exit code> <text in output> -- args...
  local want_rc=$1 want_text=$2; shift 3
  local out rc
  out=$("$BIN" "$@" 2>&1); rc=$?
  if [ "$rc" != "$want_rc" ] || ! grep -qF -- "$want_text" <<<"$out"; then
    echo "FAIL: fp8tron $* -> rc $rc (want $want_rc), output lacks: $want_text"; echo "$out" | tail -5; fail=1
  else
    echo "ok: $want_text"
  fi
}

expect 0 "iteration        4/       4 |" -- "${TINY[@]}"
expect 0 "validation loss at iteration 4" -- "${TINY[@]}"
expect 0 "usage: fp8tron" -- --help
expect 1 "did you mean '--num-layers'?" -- "${TINY[@]}" --num-layer 3
expect 1 "--bf16 and --fp16 cannot be used together" -- "${TINY[@]}" --bf16 --fp16
expect 1 "not supported yet: --overlap-grad-reduce" -- "${TINY[@]}" --overlap-grad-reduce
WORLD_SIZE=2 expect 1 "multi-process CPU runs use MPI: launch with mpirun" -- "${TINY[@]}" --tensor-model-parallel-size 2
expect 1 "--openai-gelu is not supported by fp8tron" -- "${TINY[@]}" --openai-gelu
expect 0 "has no effect in fp8tron" -- "${TINY[@]}" --no-masked-softmax-fusion
expect 0 "dry run: configuration is valid" -- "${TINY[@]}" --dry-run
# A 1,000-GPU job planned on this machine without connecting to anyone.
WORLD_SIZE=1000 expect 0 "world 1000 = TP 2 x CP 1 x DP 250 x PP 2" -- "${TINY[@]}" --tensor-model-parallel-size 2 \
  --pipeline-model-parallel-size 2 --global-batch-size 500 --dry-run
if ! command -v nvidia-smi >/dev/null 2>&1; then
  expect 1 "--device cuda: no CUDA GPU" -- "${TINY[@]}" --device cuda
fi
for cfg in "$SRC"/configs/*.json; do
  expect 0 "dry run: configuration is valid" -- --config "$cfg" --dry-run
done
if [ $fail = 0 ]; then echo "cli: all passed"; fi
exit $fail
