#!/usr/bin/env bash
# Everything to check on a machine with GPUs in one go, from a bare machine: build, GPU tests (ctest
# label gpu), multi-GPU equivalence under mpirun and torchrun, and the benchmarks. Results go to
# $OUT (or gpu-check/). Usage: scripts/gpu_check.sh [nccl] [sanitize] [equivalence] [bench] [fp8-bench]
# [fp8-convergence] [grouped] [parallel-bench] [data] [checkpoint] [moe] [moe-equivalence]
# [moe-parallel-bench] [moe-overlap] [sharded-overlap] [moe-convergence] [overlap] [overlap-bench] [recompute-cp-bench] [max-fit]
#
# nccl: every multi-process test of the suite over NCCL (ctest label nccl: the layout equivalences,
#   resume and reshard, communicators, Megatron's 8-rank configs, the multi-rank faults) on the GPUs
#   present, the ranks sharing them when there are fewer GPUs than ranks (docs/distributed_testing.md).
#   `nccl` alone builds only the programs it runs. CHECK_SHARD=i/n or CHECK_TESTS=<regex> run a part.
# sanitize: compute-sanitizer's racecheck and synccheck over a tensor-parallel overlap step (2 ranks).
# moe-overlap: the exposed expert-parallel all-to-all time without and with
#   --overlap-moe-expert-parallel-comm at EP2 (scripts/bench_moe_overlap.sh; ranks share the GPU).
# sharded-overlap: the exposed data-parallel communication time (dp-comm-exposed) without and with
#   --overlap-grad-reduce --overlap-param-gather at DP2, for the distributed optimizer and
#   Megatron-FSDP's optim_grads_params (scripts/bench_sharded_overlap.sh; ranks share the GPU).
# (max-fit: the largest micro-batch and sequence of the 1.3B model that fit on one GPU with and
# without recomputation, scripts/bench_max_fit.sh)
# (grouped: the MoE expert GEMMs against torch's grouped GEMMs, scripts/bench_grouped_gemm.sh;
# moe: the MoE GPU tests' lines and the Mixtral-style benchmark on one GPU; moe-equivalence and
# moe-parallel-bench need 2+ GPUs: expert parallelism over NCCL)
# (overlap: the tensor-parallel overlap under NCCL against the same runs without it, bf16 and FP8,
# plus the one-GPU tests of its FP8 functor; overlap-bench: bench_parallel.sh's overlap tables)
# (checkpoint: save speed, --async-save blocking, --deterministic-mode repeat and resume on the
# 1.3B model, summary in $OUT/checkpoint-summary.txt; then the Hugging Face export check)
#
# Every check's full output is in $OUT/<check>.log; the lines worth reading are printed. The
# script exits non-zero when any check fails: a non-zero exit status (a failed GPU test, a rank of
# an equivalence run that reports MISMATCH, a benchmark run that failed) or a failure line in its
# output. The failed checks are listed at the end.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export FP8TRON_SKIP_APT=1 FP8TRON_JOBS=$(nproc) BENCH_OUT=$OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
./scripts/setup.sh >"$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
# The GPU machines reach no package index, so setup.sh may leave the wandb client out: the W&B
# training case then checks the trainer's start-up error line instead of an offline run.
export FP8TRON_TEST_WANDB_OPTIONAL=1
# The NCCL steps need only the multi-process programs; any other step builds the whole tree.
NCCL_TARGETS=(fp8tron fp8tron-preprocess fp8tron_parallel_equivalence fp8tron_checkpoint_resume fp8tron_parallel_comm_test
              fp8tron_make_megatron_test_data)
ONLY_NCCL=$(($# > 0))
for step in "$@"; do case $step in nccl | sanitize | moe-overlap | sharded-overlap) ;; *) ONLY_NCCL=0 ;; esac; done
TARGETS=()
[ $ONLY_NCCL = 1 ] && TARGETS=("${NCCL_TARGETS[@]}")
( time ./scripts/build.sh "${TARGETS[@]}" ) >"$OUT/build.log" 2>&1 || { grep -m3 -A8 error "$OUT/build.log"; exit 1; }
tail -3 "$OUT/build.log"
source .setup/env.sh
GPUS=$(nvidia-smi -L | wc -l)
BUILD=${FP8TRON_BUILD_DIR:-build}

FAILED=()
# check <name> <lines to show (regex)> <command...>: runs the command into $OUT/<name>.log.
check() {
  local name=$1 show=$2
  shift 2
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  grep -hE "$show" "$OUT/$name.log" | cut -c1-240
  if [ $rc -ne 0 ] || grep -qE "MISMATCH|\*\*\*Failed|\[  FAILED  \]|\| failed:" "$OUT/$name.log"; then
    FAILED+=("$name (exit $rc)")
    echo "!! $name FAILED (exit $rc; $OUT/$name.log)"
  fi
}
EQUIV_LINES="\[rank 0\].*(equivalent|MISMATCH)|rror|differ:"

if [ $ONLY_NCCL = 0 ]; then
  echo "== GPU tests ($GPUS GPUs)"
  check gpu-tests "tests passed|\*\*\*Failed" bash -c "cd $BUILD && timeout 600 ctest -L gpu --output-on-failure"
  # The FP8 GEMM/kernel diagnostics print only when the binary runs directly.
  check fp8-gpu "fp8-bench\].*(TFLOP|GB/s|x bf16)|FAILED" ./$BUILD/tests/fp8/fp8tron_fp8_gpu_tests
  check fp8-module "fp8-module|FAILED|Failure" ./$BUILD/tests/fp8tron_gpu_tests --gtest_filter='GpuFp8*'
  # Recomputation (bitwise with dropout and FP8, peak memory) and the CP attention blocks on the fused kernels.
  check recompute-cp-gpu "recompute-memory|cp-blocks|FAILED|Failure" ./$BUILD/tests/fp8tron_gpu_tests --gtest_filter='RecomputeGpu*:ContextParallelGpu*'
fi

EQ=./build/tests/fp8tron_parallel_equivalence
MPI=(timeout 240 mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=4)
for step in "$@"; do
  case $step in
    nccl)
      # Every rank of every test on the GPUs present; ctest runs as many tests side by side as
      # there are cores (PROCESSORS = ranks). The per-test lines (and each rank's measured
      # differences) are in $OUT/nccl.log. With one GPU the whole suite takes longer than one
      # machine call allows: CHECK_SHARD=i/n runs every n-th test from the i-th (1-based), and
      # CHECK_TESTS=<regex> the tests whose names match.
      echo "== the multi-process suite over NCCL ($GPUS GPU(s), ranks sharing them)"
      select=()
      [ -n "${CHECK_TESTS:-}" ] && select+=(-R "$CHECK_TESTS")
      [ -n "${CHECK_SHARD:-}" ] && select+=(-I "${CHECK_SHARD%/*},,${CHECK_SHARD#*/}")
      quoted=""
      ((${#select[@]})) && printf -v quoted '%q ' "${select[@]}"
      check nccl "tests passed|tests failed|\*\*\*Failed|\*\*\*Timeout|Total Test time" bash -c \
        "cd $BUILD && ctest -L nccl $quoted -j ${CHECK_JOBS:-$(nproc)} --timeout 600 --output-on-failure -V"
      grep -hE "^[0-9]+: \[rank 0\].*(equivalent|MISMATCH)|^[0-9]+: \[rank 0\].*resume|^[0-9]+: (ok|FAIL) " "$OUT/nccl.log" \
        >"$OUT/nccl-summary.txt" ;;
    sanitize)
      # The tensor-parallel overlap's kernels and streams under compute-sanitizer (2 ranks, bf16 and
      # FP8, two steps): shared-memory races (racecheck) and misuse of barriers and syncs (synccheck)
      # in fp8tron's own kernels (namespace fp8tron). Library kernels are left out: synccheck flags
      # the warp-specialised barriers of NCCL's send/recv kernel (and then aborts it), racecheck
      # flags the wgmma shared-memory reads of cuDNN's flash-attention kernels, which it cannot
      # order, and over the FP8 step it stops with an internal error (a hardware exception it could
      # not handle) in a kernel of the libraries. SANITIZE_STEPS picks steps (e.g. "fp8-racecheck").
      echo "== compute-sanitizer over a tensor-parallel overlap step"
      SAN_FLAGS=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --micro-batch-size 2
                 --global-batch-size 2 --train-iters 2 --lr 1e-3 --vocab-size 256 --builtin-data --bf16 --eval-iters 0
                 --tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap --tp-comm-overlap-rs-dgrad)
      # synccheck instruments fp8tron's kernels only; racecheck restricted that way stops with an
      # internal error (a hardware exception) even over the bf16 step, so it leaves out the
      # libraries' kernels by name instead.
      SAN=(compute-sanitizer --error-exitcode 9)
      SYNC_FILTER=(--kernel-name kns=fp8tron)
      RACE_FILTER=(--kernel-name-exclude kns=nccl --kernel-name-exclude kns=cudnn --kernel-name-exclude kns=sdpa
                   --kernel-name-exclude kns=nvjet --kernel-name-exclude kns=xmma --kernel-name-exclude kns=cutlass)
      sanitize_step() { # <log name> <tool> [extra trainer flags...]
        local name=$1 tool=$2 filter
        shift 2
        [[ " ${SANITIZE_STEPS:-racecheck synccheck fp8-racecheck fp8-synccheck} " == *" ${name#sanitize-} "* ]] || return 0
        if [ "$tool" = racecheck ]; then filter=("${RACE_FILTER[@]}"); else filter=("${SYNC_FILTER[@]}"); fi
        check "$name" "ERROR SUMMARY|rror" ./tests/parallel/nccl_launch.sh mpirun 2 "${SAN[@]}" "${filter[@]}" --tool "$tool" \
          ./$BUILD/fp8tron "${SAN_FLAGS[@]}" "$@"
      }
      sanitize_step sanitize-racecheck racecheck
      sanitize_step sanitize-synccheck synccheck
      sanitize_step sanitize-fp8-racecheck racecheck --fp8-format hybrid
      sanitize_step sanitize-fp8-synccheck synccheck --fp8-format hybrid ;;
    moe-overlap)
      echo "== the expert-parallel all-to-all overlap (EP2, ranks sharing the GPUs when fewer)"
      check moe-overlap "^\\|" ./scripts/bench_moe_overlap.sh 2 ;;
    sharded-overlap)
      echo "== the data-parallel communication overlap (DP2, ranks sharing the GPUs when fewer)"
      check sharded-overlap "^\\|" ./scripts/bench_sharded_overlap.sh 2 ;;
    equivalence)
      echo "== NCCL equivalence (bf16, tolerance 2e-2; fp32 1e-4)"
      check eq-tp2-fp32 "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --tensor-model-parallel-size 2 --tolerance 1e-4
      check eq-pp2-bf16 "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --bf16 --pipeline-model-parallel-size 2 --tolerance 2e-2
      if [ "$GPUS" -ge 4 ]; then
        check eq-tp2-pp2-sp-vpp "$EQUIV_LINES" "${MPI[@]}" -np 4 $EQ --device cuda --bf16 --tensor-model-parallel-size 2 \
          --pipeline-model-parallel-size 2 --sequence-parallel --num-layers-per-virtual-pipeline-stage 1 --tolerance 2e-2
        check eq-dp4-distopt "$EQUIV_LINES" "${MPI[@]}" -np 4 $EQ --device cuda --bf16 --use-distributed-optimizer --tolerance 2e-2
        check eq-torchrun-tp2-sp "$EQUIV_LINES" timeout 240 torchrun --nproc-per-node 4 --no-python $EQ --device cuda --bf16 \
          --tensor-model-parallel-size 2 --sequence-parallel --tolerance 2e-2
      else
        check eq-torchrun-tp2-sp "$EQUIV_LINES" timeout 240 torchrun --nproc-per-node 2 --no-python $EQ --device cuda --bf16 \
          --tensor-model-parallel-size 2 --sequence-parallel --tolerance 2e-2
      fi
      check eq-dp2-overlap "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --overlap-grad-reduce --ddp-bucket-size 3000 --tolerance 1e-4
      # Context parallelism over NCCL: the ring's overlapped send/receive on the communication
      # stream, the fused attention kernels as blocks (LSE merge), all-to-all and all-gather.
      check eq-cp2-p2p-fp32 "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --context-parallel-size 2 --tolerance 1e-4
      check eq-cp2-p2p-bf16 "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --bf16 --context-parallel-size 2 --seq-length 256 \
        --tolerance 2e-2
      check eq-cp2-a2a-bf16 "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --bf16 --context-parallel-size 2 --cp-comm-type a2a \
        --tolerance 2e-2
      check eq-cp2-allgather-bf16 "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --bf16 --context-parallel-size 2 \
        --cp-comm-type all_gather --tolerance 2e-2
      check eq-cp2-recompute-fp8 "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --bf16 --context-parallel-size 2 \
        --fp8-format hybrid --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 --tolerance 2e-2
      # ... with experts over the CP ranks (the token all-to-all on the CP ranks' NCCL group),
      # multi-latent attention (values padded to the query head size for the fused kernels, each
      # comm type) with multi-token prediction (the shifts' send/receive), the per-token loss.
      CPX_MOE=(--num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 --moe-layer-freq '([0]+[1]*3)'
               --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3)
      CPX_MLA=(--multi-latent-attention --q-lora-rank 16 --kv-lora-rank 16 --qk-head-dim 8 --qk-pos-emb-head-dim 8
               --v-head-dim 8 --qk-layernorm --rotary-scaling-factor 4 --mscale 1 --mscale-all-dim 1)
      check eq-cp2-ep2-moe-alltoall-bf16 "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --bf16 --context-parallel-size 2 \
        "${CPX_MOE[@]}" --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall --tolerance 2e-2
      for cpx_type in p2p a2a all_gather; do
        check eq-cp2-mla-mtp-$cpx_type-bf16 "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --bf16 --context-parallel-size 2 \
          --cp-comm-type $cpx_type "${CPX_MLA[@]}" --mtp-num-layers 2 --position-embedding-type rope --tolerance 2e-2
      done
      check eq-cp2-per-token-loss-fp32 "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --context-parallel-size 2 \
        --calculate-per-token-loss --eod-mask-loss --tolerance 1e-4
      if [ "$GPUS" -ge 4 ]; then
        check eq-cp2-tp2-sp "$EQUIV_LINES" "${MPI[@]}" -np 4 $EQ --device cuda --bf16 --context-parallel-size 2 \
          --tensor-model-parallel-size 2 --sequence-parallel --tolerance 2e-2
        check eq-cp4-a2a-p2p "$EQUIV_LINES" "${MPI[@]}" -np 4 $EQ --device cuda --bf16 --context-parallel-size 4 \
          --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2 --tolerance 2e-2
        check eq-cp2-pp2-ep2-moe-bf16 "$EQUIV_LINES" "${MPI[@]}" -np 4 $EQ --device cuda --bf16 --context-parallel-size 2 \
          --pipeline-model-parallel-size 2 "${CPX_MOE[@]}" --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall \
          --tolerance 2e-2
      fi
      if [ "$GPUS" -ge 8 ]; then
        # The layout of Megatron's gpt3_mcore_tp2_cp2_pp2_ep2_te_4experts2parallel (its router: aux loss here).
        check eq-tp2-cp2-pp2-ep2-moe-bf16 "$EQUIV_LINES" "${MPI[@]}" -np 8 $EQ --device cuda --bf16 \
          --tensor-model-parallel-size 2 --context-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel \
          --disable-bias-linear "${CPX_MOE[@]}" --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall --tolerance 2e-2
      fi
      # FP8 over NCCL: delayed scaling with amaxes reduced over the tensor-parallel group.
      check eq-tp2-sp-fp8 "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --bf16 --tensor-model-parallel-size 2 \
        --sequence-parallel --fp8-format hybrid --tolerance 2e-2
      check eq-dp2-fp8-tensorwise-distopt "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --bf16 --fp8-format hybrid \
        --fp8-recipe tensorwise --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 3000 --tolerance 2e-2
      # srun's environment (no SLURM here): two processes with SLURM_* set as srun sets them.
      srun_style() {
        local pids=() rc=0
        for r in 0 1; do
          SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_NTASKS_PER_NODE=2 SLURM_NNODES=1 SLURM_NODEID=0 \
            SLURM_JOB_ID=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 timeout 240 $EQ --device cuda --bf16 \
            --tensor-model-parallel-size 2 --tolerance 2e-2 > "$OUT/srun-$r.log" 2>&1 &
          pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p" || rc=1; done
        cat "$OUT/srun-0.log"
        return $rc
      }
      check eq-srun-style-tp2 "$EQUIV_LINES" srun_style
      check eq-dp2-distopt "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --bf16 --use-distributed-optimizer --tolerance 2e-2
      # Overlapped distributed optimizer: buckets reduced onto their owners during backward, the
      # weights' all-gather overlapped with the next forward (bitwise the run without it).
      check eq-dp2-distopt-param-gather "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --use-distributed-optimizer \
        --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 3000 --tolerance 1e-4 --identical-without --overlap-param-gather
      if [ "$GPUS" -ge 4 ]; then
        check eq-pp2-dp2-distopt-overlap "$EQUIV_LINES" "${MPI[@]}" -np 4 $EQ --device cuda --bf16 --pipeline-model-parallel-size 2 \
          --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 3000 --tolerance 2e-2
        check eq-tp2-sp-dp2-distopt-overlap "$EQUIV_LINES" "${MPI[@]}" -np 4 $EQ --device cuda --bf16 --tensor-model-parallel-size 2 \
          --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 3000 \
          --tolerance 2e-2
      fi ;;
    bench) echo "== single-GPU benchmarks"; check bench "^\|" ./scripts/bench.sh gpt2-124m gpt-1.3b ;;
    grouped)
      echo "== MoE expert GEMMs: fp8tron grouped vs torch._grouped_mm / torch._scaled_grouped_mm (TFLOP/s eager / graph)"
      check grouped "^== |agreement|TFLOP|FP8 |bf16 |grouped-bench" ./scripts/bench_grouped_gemm.sh ;;
    fp8-bench)
      echo "== FP8 throughput (bf16, delayed, tensorwise)"
      check fp8-bench-bf16 "^\|" ./scripts/bench.sh gpt-1.3b gpt2-124m
      check fp8-bench-delayed "^\|" env BENCH_TAG=delayed ./scripts/bench.sh gpt-1.3b gpt2-124m -- --fp8-format hybrid
      check fp8-bench-tensorwise "^\|" env BENCH_TAG=tensorwise ./scripts/bench.sh gpt-1.3b gpt2-124m -- --fp8-format hybrid \
        --fp8-recipe tensorwise ;;
    fp8-convergence) echo "== FP8 convergence, GPT-2 124M, 500 steps"; check fp8-convergence "^\|" ./scripts/fp8_convergence.sh 500 ;;
    moe-convergence)
      echo "== MoE FP8 convergence, Mixtral-style (global batch 2 x 2048), 500 steps: FP8 within 0.5% of bf16"
      check moe-convergence "^\|" env CONVERGENCE_CONFIG=configs/mixtral-style.json \
        CONVERGENCE_RECIPES="bf16;delayed hybrid;tensorwise hybrid" ./scripts/fp8_convergence.sh 500 ;;
    data)
      # Real indexed data through the prefetching loader: the batch-generator timer against the step.
      echo "== data pipeline on the 1.3B model"
      data_run() {
        python3 -c "
import json, random
random.seed(1)
with open('$OUT/corpus.jsonl', 'w') as f:
    for d in range(3000):
        f.write(json.dumps({'text': ' '.join(str(random.randrange(50256)) for _ in range(random.randrange(200, 2000)))}) + '\n')" || return 1
        ./build/fp8tron-preprocess --input "$OUT/corpus.jsonl" --output-prefix /tmp/corpus --tokenizer-type NullTokenizer \
          --vocab-size 50256 --append-eod --workers 8 || return 1
        rm -f "$OUT/corpus.jsonl"
        ./build/fp8tron --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 4 \
          --global-batch-size 8 --train-iters 30 --lr 2e-4 --bf16 --attention-dropout 0 --hidden-dropout 0 \
          --data-path /tmp/corpus_text_document --split 98,2,0 --tokenizer-type NullTokenizer --vocab-size 50256 \
          --data-cache-path /tmp/cache --log-interval 10 --timing-log-level 2 --eval-iters 2 --eval-interval 30 \
          --log-throughput
      }
      check data-1.3b " iteration +30/|batch-generator|forward-backward|optimizer|validation loss" data_run ;;
    parallel-bench) echo "== multi-GPU benchmarks"; check parallel-bench "^\|" ./scripts/bench_parallel.sh "$GPUS" layouts ;;
    overlap)
      echo "== tensor-parallel overlap: FP8 functor on one GPU, NCCL equivalence on $GPUS GPUs"
      check overlap-gpu "overlap-gpu|FAILED|Failure" ./$BUILD/tests/fp8tron_gpu_tests --gtest_filter='*Overlap*'
      if [ "$GPUS" -ge 2 ]; then check overlap-nccl "$EQUIV_LINES|FAILED" ./tests/gpu_overlap_equivalence.sh $EQ "$ROOT"
      else echo "overlap-nccl: skipped, $GPUS GPU (needs 2)"; fi ;;
    overlap-bench) echo "== tensor-parallel overlap benchmarks"; check overlap-bench "^\|" ./scripts/bench_parallel.sh "$GPUS" overlap ;;
    recompute-cp-bench)
      echo "== recomputation (memory, 1 GPU) and context parallelism (throughput, $GPUS GPUs) on the 1.3B model"
      check recompute-cp-bench "^\|" ./scripts/bench_recompute_cp.sh "$GPUS" ;;
    max-fit)
      echo "== the largest micro-batch and sequence of the 1.3B model that fit, with and without recomputation"
      check max-fit "^\|" ./scripts/bench_max_fit.sh ;;
    checkpoint)
      echo "== checkpoints: speed, async blocking, deterministic repeat and resume (1.3B)"
      check checkpoint-bench "." ./scripts/bench_checkpoint.sh gpt-1.3b
      echo "== export to Hugging Face, checked with transformers"
      export_check() {
        local style=$1
        local flags=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --micro-batch-size 4
                     --train-iters 5 --lr 1e-3 --vocab-size 500 --builtin-data --eval-iters 0 --save /tmp/hf-$style --save-interval 5)
        [ "$style" = llama ] && flags+=(--position-embedding-type rope --normalization RMSNorm --swiglu --group-query-attention
                                        --num-query-groups 2 --disable-bias-linear --untie-embeddings-and-output-weights)
        # Llama 3.1 frequency scaling with RoFormer-interleaved rotary channels (exported permuted).
        [ "$style" = llama31 ] && flags+=(--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear
                                          --use-rope-scaling --rope-scaling-factor 8 --rotary-base 500000 --rotary-interleaved)
        [ "$style" = llama_yarn ] && flags+=(--position-embedding-type yarn --rotary-scaling-factor 4 --mscale 1 --mscale-all-dim 1
                                             --normalization RMSNorm --swiglu --disable-bias-linear --seq-length 64)
        [ "$style" = gpt2_relu2 ] && flags+=(--squared-relu --disable-bias-linear)
        # Multi-latent attention with YaRN and one MTP layer (DeepseekV3ForCausalLM; MTP left out).
        [ "$style" = deepseek_v3 ] && flags+=(--multi-latent-attention --q-lora-rank 32 --kv-lora-rank 32 --qk-head-dim 32
                                              --qk-pos-emb-head-dim 16 --v-head-dim 32 --qk-layernorm --rotary-scaling-factor 40
                                              --mscale 1 --mscale-all-dim 1 --position-embedding-type rope --normalization RMSNorm
                                              --swiglu --disable-bias-linear --untie-embeddings-and-output-weights --mtp-num-layers 1)
        ./build/fp8tron "${flags[@]}" && ./build/fp8tron-export --load /tmp/hf-$style --output /tmp/hf-$style-out \
          --reference-tokens 64 && python3 scripts/check_hf_export.py /tmp/hf-$style-out
      }
      for style in gpt2 llama llama31 llama_yarn gpt2_relu2 deepseek_v3; do
        check export-$style "logits|match|rror" export_check $style
      done ;;
    moe)
      echo "== mixture of experts: GPU tests, Mixtral-style benchmark (bf16, FP8)"
      check moe-gpu "moe-fp8|FAILED|Failure|OK \]" ./$BUILD/tests/fp8tron_gpu_tests --gtest_filter='GpuMoe*'
      check moe-bench "^\|" ./scripts/bench_moe.sh ;;
    moe-equivalence)
      echo "== MoE equivalence under NCCL (bf16, tolerance 2e-2; fp32 1e-4)"
      MOE=(--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 64 --moe-layer-freq "([0]+[1]*3)" --moe-aux-loss-coeff 1e-2
           --moe-z-loss-coeff 1e-3 --swiglu --disable-bias-linear --moe-router-dtype fp32)
      check eq-moe-ep2-fp32 "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda "${MOE[@]}" --expert-model-parallel-size 2 \
        --moe-token-dispatcher-type alltoall --tolerance 1e-4
      check eq-moe-ep2-allgather "$EQUIV_LINES" "${MPI[@]}" -np 2 $EQ --device cuda --bf16 "${MOE[@]}" \
        --expert-model-parallel-size 2 --tolerance 2e-2
      if [ "$GPUS" -ge 4 ]; then
        for d in alltoall allgather; do
          check eq-moe-ep4-$d "$EQUIV_LINES" "${MPI[@]}" -np 4 $EQ --device cuda --bf16 "${MOE[@]}" --expert-model-parallel-size 4 \
            --moe-token-dispatcher-type $d --tolerance 2e-2
        done
        check eq-moe-ep2-tp2-sp "$EQUIV_LINES" "${MPI[@]}" -np 4 $EQ --device cuda --bf16 "${MOE[@]}" --expert-model-parallel-size 2 \
          --tensor-model-parallel-size 2 --sequence-parallel --moe-token-dispatcher-type alltoall --tolerance 2e-2
        check eq-moe-ep2-dp2-distopt "$EQUIV_LINES" "${MPI[@]}" -np 4 $EQ --device cuda --bf16 "${MOE[@]}" \
          --expert-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
          --ddp-bucket-size 3000 --moe-token-dispatcher-type alltoall --tolerance 2e-2
        check ckpt-moe-ep4-to-ep2 "resume OK|MISMATCH|rror|first loss" timeout 600 mpirun --allow-run-as-root --bind-to none -np 4 \
          -x LD_LIBRARY_PATH ./build/tests/fp8tron_checkpoint_resume --dir /tmp/moe-ckpt --save ep=4,alltoall --load ep=2,alltoall \
          --load single "${MOE[@]}" --device cuda
      fi ;;
    moe-parallel-bench) echo "== MoE multi-GPU benchmarks"; check moe-parallel-bench "^\|" ./scripts/bench_moe.sh "$GPUS" ;;
    *) echo "unknown step '$step'"; FAILED+=("unknown step $step") ;;
  esac
done

if ((${#FAILED[@]})); then
  echo "gpu_check: ${#FAILED[@]} check(s) FAILED: ${FAILED[*]}"
  exit 1
fi
echo "gpu_check: all checks passed"
