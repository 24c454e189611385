// --deterministic-mode (Megatron's flag): training that repeats bit for bit, run to run and
// across a save and resume in the same layout. For as long as a DeterministicMode lives:
//  - torch's deterministic algorithms are on, strictly (warn_only = false, as Megatron's
//    torch.use_deterministic_algorithms(True)): atomics-free embedding and scatter backwards,
//    and an operation with no deterministic implementation is an error rather than a silent
//    source of noise;
//  - cuDNN is deterministic and does not benchmark;
//  - on GPUs, the environment of trainer/determinism_env.h (CUBLAS_WORKSPACE_CONFIG, NCCL_ALGO,
//    FP8TRON_GEMM_AUTOTUNE) is set, so it must be constructed before the first cuBLAS handle and
//    the first NCCL communicator;
//  - cuDNN fused attention is off: torch 2.11 has no deterministic backward for it
//    (sdp_utils.cpp's check_cudnn_deterministic refuses it under deterministic algorithms).
//    Flash attention then runs FlashAttention-2's deterministic backward, and where flash
//    cannot run (the document mask of --reset-attention-mask) memory-efficient attention runs
//    with a single key split (num_splits_key = 1), also deterministic. Both are slower in
//    backward than cuDNN.
// One line in the log says what changed. The destructor restores torch's switches (tests train
// several models in one process); the environment stays, as cuBLAS and NCCL have read it.
#pragma once
#include <torch/torch.h>


namespace fp8tron {

class DeterministicMode {
 public:
  explicit DeterministicMode(const torch::Device& device);
  ~DeterministicMode();
  DeterministicMode(const DeterministicMode&) = delete;
  DeterministicMode& operator=(const DeterministicMode&) = delete;

 private:
  bool algorithms_, warn_only_, cudnn_deterministic_, cudnn_benchmark_, sdp_cudnn_;
};

}  // namespace fp8tron
