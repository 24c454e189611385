#!/usr/bin/env bash
# Runs every command of README.md, as printed, on this machine's CPU, scaled down. The commands are
# the lines of every fenced block but the first: that one holds the two set-up scripts, which
# install, build and run the whole test suite, this test included. Each command runs with a small
# model's flags appended (command-line flags win over a --config file and over the flags a
# benchmark script passes before its extra flags), with these changes:
# - ./scripts/bench*.sh and fp8_convergence.sh get the small model after their `--` (2 iterations;
#   bench.sh's reference runs 1 timed iteration);
# - the torchrun line runs as a --dry-run (multi-process CPU runs use MPI, so its real run needs GPUs);
# - a command that asks for --cuda-graph-impl full_iteration (a GPU-only capture) runs without it on
#   the CPU, and a --dry-run on `--device cuda` checks that the graph is accepted for that model;
# - --dry-run commands plan a job: nothing to scale.
# The inputs the commands name (docs.jsonl, vocab.json, merges.txt) are made first, in a scratch
# directory.
# Usage: readme_commands_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
SRC=$1
BUILD=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
ln -s "$BUILD" build
ln -s "$SRC/configs" configs
ln -s "$SRC/scripts" scripts
mkdir -p .setup && ln -s "$SRC/.setup/env.sh" .setup/env.sh
source "$SRC/.setup/env.sh"
export OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1 BENCH_OUT="$WORK/bench" BENCH_ITERS=2 BENCH_REFERENCE_ITERS=1 BENCH_REFERENCE_WARMUP=1
# (A global batch of 8: one micro-batch per data-parallel rank at the commands' largest DP, 4; the
# configs' bf16 with GPT-2's vocabulary is slow on CPUs, about a second per micro-batch.)
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --num-query-groups 4 --ffn-hidden-size 128
       --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2 --global-batch-size 8 --train-iters 2
       --lr-warmup-iters 1 --eval-iters 1 --eval-interval 2 --log-interval 1 --device cpu)

# The inputs: a few documents and a byte-level GPT-2 vocabulary (every byte a token, no merges).
printf '{"text": "hello world"}\n{"text": "fp8tron trains GPT models"}\n' > docs.jsonl
"$FP8TRON_PYTHON" "$SRC/tests/cli/make_byte_vocab.py" vocab.json merges.txt

# The commands, one per line (continuation lines joined, trailing comments and comment lines dropped).
mapfile -t COMMANDS < <(awk '/^```/ { fence++; next }
  fence % 2 == 1 && fence > 1 { line = line $0; if (line ~ /\\$/) { sub(/\\$/, "", line); next } print line; line = "" }' \
  "$SRC/README.md" | sed -E 's/[[:space:]]+#[^"]*$//' | grep -Ev '^[[:space:]]*(#|$)')
[ ${#COMMANDS[@]} -ge 12 ] || { echo "FAIL: found ${#COMMANDS[@]} commands in README.md"; exit 1; }

fail=0
GRAPH="--cuda-graph-impl full_iteration"
for cmd in "${COMMANDS[@]}"; do
  run=$cmd
  case $cmd in
    *"--dry-run"*) ;;                                          # plans a job: nothing to scale
    torchrun*) run="${cmd/torchrun/$FP8TRON_PYTHON -m torch.distributed.run} ${SMALL[*]} --dry-run" ;;
    *./scripts/bench*.sh*|*./scripts/fp8_convergence.sh*)
      case $cmd in *" -- "*) run="$cmd ${SMALL[*]}" ;; *) run="$cmd -- ${SMALL[*]}" ;; esac ;;
    *fp8tron-preprocess*|*fp8tron-export*|*fp8tron-import*) ;;       # their flags come from their input
    *) run="$cmd ${SMALL[*]}" ;;
  esac
  if [[ $run == *"$GRAPH"* ]]; then
    # The graph captures GPU steps only: check it is accepted for each model the command names,
    # then run the rest of the command on the CPU.
    for cfg in $(grep -o 'gpt2-124m\|gpt-1.3b\|llama-style' <<<"$cmd"); do
      if ! out=$(./build/fp8tron --config "configs/$cfg.json" $GRAPH --device cuda --dry-run 2>&1); then
        echo "FAIL: $cmd"; echo "  the graph is refused for $cfg:"; echo "$out" | tail -3 | sed 's/^/  /'; fail=1
      fi
    done
    run=${run//$GRAPH/}
  fi
  start=$SECONDS
  if out=$(eval "$run" 2>&1); then
    echo "ok ($((SECONDS - start)) s): $cmd"
  else
    echo "FAIL: $cmd"; echo "  ran: $run"; echo "$out" | tail -5 | sed 's/^/  /'; fail=1
  fi
done
[ -f hf-gpt/model.safetensors ] || { echo "FAIL: the export command wrote no hf-gpt/model.safetensors"; fail=1; }
[ -d checkpoints/from-hf/iter_0000000 ] || { echo "FAIL: the import command wrote no checkpoints/from-hf/iter_0000000"; fail=1; }
[ $fail = 0 ] && echo "README commands: all ran"
exit $fail
