// The GEMM functor of an overlapped tensor-parallel linear (parallel/overlap/linear_kernels.h) in
// high precision: row blocks travel as they are (fp32 on the CPU, bf16 on the GPU) and every GEMM
// is the ATen call a plain F::linear's forward or autograd backward makes (addmm / mm with the same
// operand layouts), so on the CPU the chunked products equal the unchunked ones bit for bit.
#pragma once
#include <torch/torch.h>

#include "parallel/overlap/linear_kernels.h"

namespace fp8tron {

class PlainLinearKernels : public overlap::LinearKernels {
 public:
  // weight [out, in] of this rank, bias [out] or undefined (values only; the op owns the autograd).
  PlainLinearKernels(torch::Tensor weight, torch::Tensor bias);

  overlap::Operand prepare_input(const torch::Tensor& x, bool to_gather) override;
  overlap::Operand slice_rows(const overlap::Operand& op, int64_t begin, int64_t count) override;
  overlap::Operand adopt(const overlap::Operand& local, std::vector<torch::Tensor> wire) override;
  void fprop(const overlap::Operand& x, overlap::Range rows, overlap::Range cols, torch::Tensor& out) override;
  overlap::Operand saved_input(const overlap::Operand& x, bool gathered_in_backward) override;
  overlap::Operand prepare_grad_output(const torch::Tensor& dy, bool to_gather) override;
  void dgrad(const overlap::Operand& dy, overlap::Range rows, overlap::Range cols, torch::Tensor& out) override;
  overlap::Operand join(const std::vector<overlap::Operand>& blocks, bool grad_output) override;
  overlap::WeightGrads wgrad(const overlap::Operand& dy, const overlap::Operand& x, bool need_dw, bool need_db) override;
  std::vector<torch::Tensor> input_grads(torch::Tensor dx) override;
  overlap::Operand quantize_partial(const torch::Tensor& rows) override;
  torch::Tensor dequantize_partial(const overlap::Operand& block) override;

 private:
  torch::Tensor weight_, bias_;
};

}  // namespace fp8tron
