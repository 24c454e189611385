#!/usr/bin/env bash
# Everything the GPU machine checks in one go (its machines start bare): build, GPU tests (ctest
# label gpu), multi-GPU equivalence under mpirun and torchrun, and the benchmarks. Results go to
# $OUT (or gpu-check/). Usage: scripts/gpu_check.sh [equivalence] [bench] [parallel-bench] [data] [checkpoint]
# [overlap] [overlap-bench]
# (overlap: the tensor-parallel overlap under NCCL against the same runs without it, bf16 and FP8,
# plus the one-GPU tests of its FP8 functor; overlap-bench: bench_parallel.sh's overlap tables)
# (checkpoint: save speed, --async-save blocking, --deterministic-mode repeat and resume on the
# 1.3B model, summary in $OUT/checkpoint-summary.txt; then the Hugging Face export check)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export FP8TRON_SKIP_APT=1 FP8TRON_JOBS=$(nproc) BENCH_OUT=$OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
./scripts/setup.sh >"$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
( time ./scripts/build.sh ) >"$OUT/build.log" 2>&1 || { grep -m3 -A8 error "$OUT/build.log"; exit 1; }
tail -3 "$OUT/build.log"
source .setup/env.sh
GPUS=$(nvidia-smi -L | wc -l)
echo "== GPU tests ($GPUS GPUs)"
(cd build && timeout 400 ctest -L gpu --output-on-failure) >"$OUT/gpu-tests.log" 2>&1
grep -E "tests passed|\*\*\*Failed" "$OUT/gpu-tests.log" | head -20
# The FP8 GEMM/kernel diagnostics print only when the binary runs directly.
(cd build && ./tests/fp8/fp8tron_fp8_gpu_tests > "$OUT/fp8-gpu.log" 2>&1)
grep -E "fp8-bench\].*(TFLOP|GB/s|x bf16)|PASSED|FAILED" "$OUT/fp8-gpu.log" | head -30
(cd build && ./tests/fp8tron_gpu_tests --gtest_filter='GpuFp8*' > "$OUT/fp8-module.log" 2>&1)
grep -hE "fp8-module|FAILED|Failure" "$OUT/fp8-module.log" | cut -c1-200
for step in "$@"; do
  case $step in
    equivalence)
      echo "== NCCL equivalence (bf16, tolerance 2e-2; fp32 1e-4)"
      EQ=./build/tests/fp8tron_parallel_equivalence
      MPI="timeout 240 mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=4"
      $MPI -np 2 $EQ --device cuda --tensor-model-parallel-size 2 --tolerance 1e-4 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|error"
      $MPI -np 2 $EQ --device cuda --bf16 --pipeline-model-parallel-size 2 --tolerance 2e-2 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|error"
      if [ "$GPUS" -ge 4 ]; then
        $MPI -np 4 $EQ --device cuda --bf16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel \
          --num-layers-per-virtual-pipeline-stage 1 --tolerance 2e-2 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|error"
        $MPI -np 4 $EQ --device cuda --bf16 --use-distributed-optimizer --tolerance 2e-2 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|error"
        timeout 240 torchrun --nproc-per-node 4 --no-python $EQ --device cuda --bf16 --tensor-model-parallel-size 2 \
          --sequence-parallel --tolerance 2e-2 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|rror"
      else
        timeout 240 torchrun --nproc-per-node 2 --no-python $EQ --device cuda --bf16 --tensor-model-parallel-size 2 \
          --sequence-parallel --tolerance 2e-2 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|rror"
      fi
      $MPI -np 2 $EQ --device cuda --overlap-grad-reduce --ddp-bucket-size 3000 --tolerance 1e-4 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|error"
      # FP8 over NCCL: delayed scaling with amaxes reduced over the tensor-parallel group.
      $MPI -np 2 $EQ --device cuda --bf16 --tensor-model-parallel-size 2 --sequence-parallel --fp8-format hybrid \
        --tolerance 2e-2 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|error"
      $MPI -np 2 $EQ --device cuda --bf16 --fp8-format hybrid --fp8-recipe tensorwise --use-distributed-optimizer \
        --overlap-grad-reduce --ddp-bucket-size 3000 --tolerance 2e-2 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|error"
      # srun's environment (no SLURM here): two processes with SLURM_* set as srun sets them.
      for r in 0 1; do
        SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_NTASKS_PER_NODE=2 SLURM_NNODES=1 SLURM_NODEID=0 \
          SLURM_JOB_ID=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 timeout 240 $EQ --device cuda --bf16 \
          --tensor-model-parallel-size 2 --tolerance 2e-2 > "$OUT/srun-$r.log" 2>&1 &
      done
      wait
      grep -hE "\[rank 0\].*(equivalent|MISMATCH)|rror" "$OUT/srun-0.log" | sed 's/^/srun-style launch: /' 
      $MPI -np 2 $EQ --device cuda --bf16 --use-distributed-optimizer --tolerance 2e-2 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|error"
      # Overlapped distributed optimizer: buckets reduced onto their owners during backward, the
      # weights' all-gather overlapped with the next forward (bitwise the run without it).
      $MPI -np 2 $EQ --device cuda --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 3000 \
        --tolerance 1e-4 --identical-without --overlap-param-gather 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|rror|differ"
      if [ "$GPUS" -ge 4 ]; then
        $MPI -np 4 $EQ --device cuda --bf16 --pipeline-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce \
          --overlap-param-gather --ddp-bucket-size 3000 --tolerance 2e-2 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|error"
        $MPI -np 4 $EQ --device cuda --bf16 --tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer \
          --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 3000 --tolerance 2e-2 2>&1 | grep -E "\[rank 0\].*(equivalent|MISMATCH)|error"
      fi ;;
    bench) echo "== single-GPU benchmarks"; ./scripts/bench.sh gpt2-124m gpt-1.3b ;;
    fp8-bench)
      echo "== FP8 throughput (bf16, delayed, tensorwise)"
      ./scripts/bench.sh gpt-1.3b gpt2-124m
      BENCH_TAG=delayed ./scripts/bench.sh gpt-1.3b gpt2-124m -- --fp8-format hybrid
      BENCH_TAG=tensorwise ./scripts/bench.sh gpt-1.3b gpt2-124m -- --fp8-format hybrid --fp8-recipe tensorwise
      grep -h "FP8:" "$OUT"/gpt-1.3b-delayed.log | head -2 | cut -c1-250 ;;
    fp8-convergence) echo "== FP8 convergence, GPT-2 124M, 500 steps"; ./scripts/fp8_convergence.sh 500 ;;
    data)
      # Real indexed data through the prefetching loader: the batch-generator timer against the step.
      echo "== data pipeline on the 1.3B model"
      python3 -c "
import json, random
random.seed(1)
with open('$OUT/corpus.jsonl', 'w') as f:
    for d in range(3000):
        f.write(json.dumps({'text': ' '.join(str(random.randrange(50256)) for _ in range(random.randrange(200, 2000)))}) + '\n')"
      ./build/fp8tron-preprocess --input "$OUT/corpus.jsonl" --output-prefix /tmp/corpus --tokenizer-type NullTokenizer \
        --vocab-size 50256 --append-eod --workers 8 2>&1 | tail -1
      rm -f "$OUT/corpus.jsonl"
      ./build/fp8tron --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 4 \
        --global-batch-size 8 --train-iters 30 --lr 2e-4 --bf16 --attention-dropout 0 --hidden-dropout 0 \
        --data-path /tmp/corpus_text_document --split 98,2,0 --tokenizer-type NullTokenizer --vocab-size 50256 \
        --data-cache-path /tmp/cache --log-interval 10 --timing-log-level 2 --eval-iters 2 --eval-interval 30 \
        --log-throughput > "$OUT/data-1.3b.log" 2>&1
      grep -E " iteration +30/|batch-generator|forward-backward|optimizer|validation loss" "$OUT/data-1.3b.log" | cut -c1-240 ;;
    parallel-bench) echo "== multi-GPU benchmarks"; ./scripts/bench_parallel.sh "$GPUS" layouts ;;
    overlap)
      echo "== tensor-parallel overlap: FP8 functor on one GPU, NCCL equivalence on $GPUS GPUs"
      (cd build && ./tests/fp8tron_gpu_tests --gtest_filter='*Overlap*' > "$OUT/overlap-gpu.log" 2>&1)
      grep -hE "overlap-gpu|FAILED|PASSED|Failure" "$OUT/overlap-gpu.log" | cut -c1-200
      ./tests/gpu_overlap_equivalence.sh ./build/tests/fp8tron_parallel_equivalence "$ROOT" 2>&1 | tee "$OUT/overlap-nccl.log" ;;
    overlap-bench) echo "== tensor-parallel overlap benchmarks"; ./scripts/bench_parallel.sh "$GPUS" overlap ;;
    checkpoint)
      echo "== checkpoints: speed, async blocking, deterministic repeat and resume (1.3B)"
      ./scripts/bench_checkpoint.sh gpt-1.3b
      echo "== export to Hugging Face, checked with transformers"
      for style in gpt2 llama; do
        flags=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --micro-batch-size 4
               --train-iters 5 --lr 1e-3 --vocab-size 500 --builtin-data --eval-iters 0 --save /tmp/hf-$style --save-interval 5)
        [ $style = llama ] && flags+=(--position-embedding-type rope --normalization RMSNorm --swiglu --group-query-attention
                                      --num-query-groups 2 --disable-bias-linear --untie-embeddings-and-output-weights)
        ./build/fp8tron "${flags[@]}" > "$OUT/export-$style.log" 2>&1 || { tail -2 "$OUT/export-$style.log"; continue; }
        ./build/fp8tron-export --load /tmp/hf-$style --output /tmp/hf-$style-out --reference-tokens 64 >> "$OUT/export-$style.log" 2>&1 \
          && python3 scripts/check_hf_export.py /tmp/hf-$style-out 2>&1 | tail -2
      done ;;
  esac
done
