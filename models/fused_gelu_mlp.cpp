#include "models/fused_gelu_mlp.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "core/error.h"
#include "core/text.h"
#include "fp8/gemm.h"
#include "fp8/grouped_gemm.h"
#include "fp8/wgrad_fusion.h"
#include "models/linear_grads.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

CUstream_st* stream_of(const torch::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

const void* data_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// The device's shared heuristic-choice handle (fp8/grouped_gemm.h): the same kernels in every run
// and on every rank, as at::linear and the fused linear's wgrad GEMM.
fp8::GemmHandle& handle() { return fp8::grouped_gemm_resources().handle; }

// fc1 with the forward GeLU epilogue: g = gelu(x W1^T + b1) and pre = x W1^T + b1, both [tokens, ffn].
void fc1_gelu(const torch::Tensor& x2d, const torch::Tensor& w1, const torch::Tensor& b1, torch::Tensor& g,
              torch::Tensor& pre) {
  const int64_t tokens = x2d.size(0), in = x2d.size(1), ffn = w1.size(0);
  const fp8::RowMajorMatrix x{x2d.data_ptr(), fp8::DType::kBF16, tokens, in, in};
  const fp8::RowMajorMatrix w{w1.data_ptr(), fp8::DType::kBF16, ffn, in, in};
  fp8::GemmConfig config;
  config.bias = data_or_null(b1);
  config.bias_dtype = fp8::DType::kBF16;
  config.activation = fp8::GemmActivation::kGeluAux;
  config.aux = pre.data_ptr();
  config.aux_ld = ffn;  // pre is laid out like G (gemm_nt's D: column-major ffn x tokens)
  fp8::gemm_nt(handle(), x, w, g.data_ptr(), fp8::DType::kBF16, ffn, config, stream_of(x2d));
}

// The biases are optional inputs: absent ones are no autograd inputs, and get no gradient.
struct FusedGeluMlp : torch::autograd::Function<FusedGeluMlp> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w1,
                               const std::optional<torch::Tensor>& b1, const torch::Tensor& w2,
                               const std::optional<torch::Tensor>& b2) {
    const c10::cuda::CUDAGuard device(x.device());
    const torch::Tensor fc1_bias = b1.value_or(torch::Tensor()), fc2_bias = b2.value_or(torch::Tensor());
    const int64_t in = w1.size(1), ffn = w1.size(0);
    const auto x2d = x.reshape({-1, in}).contiguous();
    auto sizes = x.sizes().vec();
    sizes.back() = ffn;
    auto g = torch::empty(sizes, x.options()), pre = torch::empty(sizes, x.options());
    fc1_gelu(x2d, w1.contiguous(), fc1_bias, g, pre);
    ctx->save_for_backward({x, w1, fc1_bias, w2, fc2_bias, g, pre});
    return at::linear(g, w2, fc2_bias);  // [..., ffn] in, like the unfused chain's fc2
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &w1 = saved[1], &b1 = saved[2], &w2 = saved[3], &b2 = saved[4];
    const c10::cuda::CUDAGuard device(x.device());
    const int64_t in = w1.size(1), ffn = w1.size(0), out = w2.size(0);
    const auto g = saved[5].reshape({-1, ffn}), pre = saved[6].reshape({-1, ffn});
    // The gradient of a sum arrives expanded, of a cast in another dtype.
    const auto dy = grads[0].reshape({-1, out}).to(torch::kBFloat16).contiguous();
    // fc2's dgrad, then GeLU's derivative from the saved pre-activation. Not cuBLASLt's
    // DGELU_BGRAD epilogue: on an H200 it ran as a separate generic epilogue kernel after the
    // GEMM, 0.61 ms per GPT 1.3B layer against 0.11 ms for torch's gelu_backward (docs/benchmarks.md).
    const auto dpre = at::gelu_backward(at::mm(dy, w2), pre, "tanh");
    // Gradients in the order of forward's arguments; the parameters' go into their main
    // gradients where they have them (undefined here), the rest to autograd.
    variable_list result(5);
    const auto fc2 = linear_param_grads(dy, g, w2, b2, true, b2.defined());
    result[3] = fc2.weight;
    result[4] = fc2.bias;
    if (ctx->needs_input_grad(0)) result[0] = at::mm(dpre, w1).view(x.sizes());
    // fc1's weight and bias gradients from its wgrad GEMM (the bias's through BGRADB, in fp32).
    const auto fc1 = linear_param_grads(dpre, x.reshape({-1, in}), w1, b1, true, b1.defined());
    result[1] = fc1.weight;
    result[2] = fc1.bias;
    return result;
  }
};

}  // namespace

std::string fused_gelu_mlp_blocker(const torch::Tensor& x, const GeluMlpParams& p) {
  if (!gradient_accumulation_fusion()) return "gradient-accumulation fusion is off";
  const auto bf16 = [](const torch::Tensor& t) { return !t.defined() || t.scalar_type() == torch::kBFloat16; };
  if (!bf16(x) || !bf16(p.fc1_weight) || !bf16(p.fc1_bias) || !bf16(p.fc2_weight) || !bf16(p.fc2_bias))
    return "the input and parameters are not all bf16";
  const auto& w1 = p.fc1_weight;
  const auto& w2 = p.fc2_weight;
  const auto vector_of = [](const torch::Tensor& b, int64_t n) { return !b.defined() || (b.dim() == 1 && b.size(0) == n); };
  FP8TRON_CHECK(w1.dim() == 2 && w2.dim() == 2 && x.dim() >= 1 && x.size(-1) == w1.size(1) && w2.size(1) == w1.size(0) &&
                    vector_of(p.fc1_bias, w1.size(0)) && vector_of(p.fc2_bias, w2.size(0)),
                "fused GeLU MLP: the input's and parameters' shapes do not chain");
  if (!w1.requires_grad() || !w2.requires_grad() || !is_main_grad(w1) || !is_main_grad(w2))
    return "a weight has no fp32 main gradient";
  if (w1.size(0) % 8 != 0)
    return strprintf("fc1's %lld output features (this rank's) are not a multiple of 8 (cuBLASLt's GeLU aux matrix)",
                     static_cast<long long>(w1.size(0)));
  if (x.numel() == 0) return "no tokens";
  const auto on_device = [&x](const torch::Tensor& t) { return !t.defined() || t.device() == x.device(); };
  if (!x.is_cuda() || !on_device(w1) || !on_device(w2) || !on_device(p.fc1_bias) || !on_device(p.fc2_bias))
    return "not on a GPU";
  return "";
}

torch::Tensor fused_gelu_mlp(const torch::Tensor& x, const GeluMlpParams& p) {
  const std::string blocker = fused_gelu_mlp_blocker(x, p);
  FP8TRON_CHECK(blocker.empty(), "fused GeLU MLP called where it does not apply: " + blocker);
  const auto optional = [](const torch::Tensor& t) { return t.defined() ? std::optional<torch::Tensor>(t) : std::nullopt; };
  return FusedGeluMlp::apply(x, p.fc1_weight, optional(p.fc1_bias), p.fc2_weight, optional(p.fc2_bias));
}

}  // namespace fp8tron
