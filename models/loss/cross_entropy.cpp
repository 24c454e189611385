#include "models/loss/cross_entropy.h"

#include <c10/cuda/CUDAStream.h>

#include "core/error.h"
#include "models/loss/cross_entropy_kernels.h"
#include "models/kernel_float_of.h"
#include "parallel/tensor_parallel.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::FloatType logits_type(const torch::Tensor& t) {
  const auto type = kernel_float_of(t);
  FP8TRON_CHECK(type.has_value(), std::string("fused cross entropy: logits of dtype ") + c10::toString(t.scalar_type()));
  return *type;
}

struct FusedCrossEntropy : torch::autograd::Function<FusedCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits_in, const torch::Tensor& target,
                               int64_t vocab_start, Communicator* comm) {
    const int64_t vocab = logits_in.size(-1);
    auto logits = logits_in.contiguous().view({-1, vocab});
    const int64_t rows = logits.size(0);
    // Target ids in this shard's coordinates; ids another shard holds fall outside [0, vocab).
    auto local_target = (target.reshape({-1}) - vocab_start).to(torch::kInt64).contiguous();
    auto f32 = torch::TensorOptions().device(logits.device()).dtype(torch::kFloat32);
    auto row_max = torch::empty({rows}, f32), sum_exp = torch::empty({rows}, f32), target_logit = torch::empty({rows}, f32);
    const auto stream = c10::cuda::getCurrentCUDAStream(logits.device().index()).stream();
    kernels::cross_entropy_row_stats(logits.data_ptr(), logits_type(logits), local_target.data_ptr<int64_t>(), rows, vocab,
                                     row_max.data_ptr<float>(), sum_exp.data_ptr<float>(), target_logit.data_ptr<float>(),
                                     stream);
    if (comm->size() > 1) {
      // Megatron's combination over vocabulary shards: global maximum, sums rescaled to it.
      auto global_max = row_max.clone();
      comm->all_reduce(global_max, ReduceOp::Max);
      sum_exp.mul_((row_max - global_max).exp_());
      comm->all_reduce(sum_exp);
      comm->all_reduce(target_logit);
      row_max = global_max;
    }
    auto lse = sum_exp.log_().add_(row_max);  // log-sum-exp of each row
    auto loss = (lse - target_logit).view(target.sizes());
    ctx->save_for_backward({logits, local_target, lse});
    ctx->saved_data["shape"] = logits_in.sizes().vec();
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto saved = ctx->get_saved_variables();
    auto logits = saved[0];  // overwritten with its gradient: nothing else reads the logits after the loss
    auto g = grad[0].to(torch::kFloat32).contiguous();
    const auto stream = c10::cuda::getCurrentCUDAStream(logits.device().index()).stream();
    kernels::cross_entropy_backward(logits.data_ptr(), logits_type(logits), saved[1].data_ptr<int64_t>(),
                                    saved[2].data_ptr<float>(), g.data_ptr<float>(), logits.size(0), logits.size(1),
                                    stream);
    return {logits.view(ctx->saved_data["shape"].toIntVector()), {}, {}, {}};
  }
};

}  // namespace

torch::Tensor fused_vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                                 int64_t vocab_start, Communicator& tp) {
  if (!logits.is_cuda()) return vocab_parallel_cross_entropy(logits, target, vocab_start, tp);
  return FusedCrossEntropy::apply(logits, target, vocab_start, &tp);
}

}  // namespace fp8tron
