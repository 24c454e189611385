#include "models/mlp/fused_gelu_mlp.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "core/error.h"
#include "core/text.h"
#include "models/kernel_stream_of.h"
#include "models/linear/linear_grads.h"
#include "models/mlp/gelu_kernels.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;


// Inputs: fc1's input (or, with has_norm, the residual its norm reads, and the stream's pending
// branch), the norm's gamma and beta, w1, b1, w2, b2, and the pending branch's bias; the optional
// ones absent are no autograd inputs (needs_input_grad counts the present ones, the returned
// gradients every argument).
// Outputs {y}, or {sum, y} with a norm and a branch.
struct FusedGeluMlp : torch::autograd::Function<FusedGeluMlp> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& input, const std::optional<torch::Tensor>& branch,
                               const std::optional<torch::Tensor>& gamma, const std::optional<torch::Tensor>& beta,
                               const torch::Tensor& w1, const std::optional<torch::Tensor>& b1, const torch::Tensor& w2,
                               const std::optional<torch::Tensor>& b2, const std::optional<torch::Tensor>& branch_bias,
                               bool rms, double epsilon, bool zero_centered_gamma, const MainGradsPtr& main_grads) {
    const c10::cuda::CUDAGuard device(input.device());
    ctx->set_materialize_grads(false);
    const bool has_norm = gamma.has_value();
    const NormPrologue norm = norm_of(has_norm, rms, epsilon, zero_centered_gamma, gamma, beta);
    // With a norm, x (fc1's input) is its output, and is not kept: the norm's backward rebuilds it.
    NormPrologueForward normed;
    const auto pending_bias = branch_bias.value_or(torch::Tensor());
    if (has_norm) normed = norm_prologue_forward(input, branch.value_or(torch::Tensor()), norm, pending_bias);
    const torch::Tensor& x = has_norm ? normed.normed : input;
    const torch::Tensor fc1_bias = b1.value_or(torch::Tensor()), fc2_bias = b2.value_or(torch::Tensor());
    const int64_t in = w1.size(1);
    // fc1 with its bias in the GEMM's epilogue, then GeLU: g lives only until fc2 has run.
    const auto pre = at::linear(x.reshape({-1, in}), w1, fc1_bias);
    auto g = torch::empty_like(pre);
    kernels::gelu_tanh_forward(pre.data_ptr(), g.data_ptr(), g.numel(), kernel_stream_of(x));
    ctx->save_for_backward({has_norm ? torch::Tensor() : x, normed.saved.sum, normed.saved.mean, normed.saved.rstd,
                            norm.weight, norm.bias, w1, fc1_bias, w2, fc2_bias, pre, pending_bias});
    ctx->saved_data["has_branch"] = branch.has_value();
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["zero_centered_gamma"] = zero_centered_gamma;
    ctx->saved_data["main_grads"] = main_grads_value(main_grads);
    auto sizes = x.sizes().vec();
    sizes.back() = w2.size(0);
    auto y = at::linear(g, w2, fc2_bias).view(sizes);
    if (has_norm && branch.has_value()) return {normed.sum, y};
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const NormSaved kept{saved[1], saved[2], saved[3]};
    const torch::Tensor &gamma = saved[4], &beta = saved[5], &w1 = saved[6], &b1 = saved[7], &w2 = saved[8],
                        &b2 = saved[9], &pre = saved[10], &branch_bias = saved[11];
    const bool has_norm = gamma.defined(), has_branch = ctx->saved_data["has_branch"].toBool();
    const c10::cuda::CUDAGuard device(pre.device());
    const int64_t in = w1.size(1), ffn = w1.size(0), out = w2.size(0), tokens = pre.size(0);
    const bool two_outputs = has_norm && has_branch;
    const torch::Tensor d_sum = two_outputs ? grads[0] : torch::Tensor();
    const torch::Tensor& dy_in = grads[two_outputs ? 1 : 0];
    variable_list result(13);
    // The pending branch bias's edge: after every present tensor input before it.
    const int64_t branch_bias_edge = 1 + int64_t(has_branch) + int64_t(has_norm) + int64_t(beta.defined()) + 1 +
                                     int64_t(b1.defined()) + 1 + int64_t(b2.defined());
    // (An absent input has no edge to ask about.)
    NormGradRequest request;
    request.main_grads = main_grads_of(ctx->saved_data["main_grads"]);
    const MainGradsPtr& main_grads = request.main_grads;
    request.branch_bias =
        bias_grad_target(branch_bias, branch_bias.defined() && ctx->needs_input_grad(branch_bias_edge), main_grads);
    if (!dy_in.defined()) {  // the MLP's output was not used: only the sum's gradient flows on
      if (has_norm) result[0] = result[1] = norm_prologue_backward(NormPrologue{}, kept, {}, d_sum, request, false).d_in;
      result[8] = bias_grad_for_autograd(branch_bias, request.branch_bias);
      return result;
    }
    // The gradient of a sum arrives expanded, of a cast in another dtype.
    const auto dy = dy_in.reshape({-1, out}).to(torch::kBFloat16).contiguous();
    // fc2's dgrad, then one pass: dL/dg becomes dL/dpre in place, g = gelu(pre) is recomputed for
    // fc2's wgrad, and fc1's bias gradient is summed (models/mlp/gelu_kernels.h). Neither cuBLASLt's
    // DGELU_BGRAD epilogue (on an H200 a separate generic kernel, 0.61 ms per GPT 1.3B layer) nor
    // its BGRADB one (a second read of dL/dpre).
    auto grad = at::mm(dy, w2);
    auto g = torch::empty_like(pre);
    const auto bias = bias_grad_target(b1, true, main_grads);
    auto scratch = bias.grad.defined()
                       ? torch::empty({kernels::gelu_backward_scratch_floats(tokens, ffn)}, pre.options().dtype(torch::kFloat32))
                       : torch::Tensor();
    kernels::gelu_tanh_backward(grad.data_ptr(), pre.data_ptr(), g.data_ptr(), tokens, ffn,
                                scratch.defined() ? scratch.data_ptr<float>() : nullptr,
                                bias.grad.defined() ? bias.grad.data_ptr<float>() : nullptr, bias.accumulate, kernel_stream_of(pre));
    const auto& dpre = grad;
    // Gradients in the order of forward's arguments; the parameters' go into their main
    // gradients where they have them (undefined here), the rest to autograd.
    const auto fc2 = linear_param_grads(dy, g, w2, b2, true, b2.defined(), main_grads);
    result[6] = fc2.weight;
    result[7] = fc2.bias;
    torch::Tensor x = saved[0];
    if (has_norm) {
      // fc1's dgrad feeds the norm's backward, whose pass writes x again for fc1's wgrad.
      const int64_t gamma_edge = has_branch ? 2 : 1;
      request.gamma = ctx->needs_input_grad(gamma_edge);
      request.beta = beta.defined() && ctx->needs_input_grad(gamma_edge + 1);
      const auto n = norm_prologue_backward(norm_of(true, ctx->saved_data["rms"].toBool(), 0.0,
                                                    ctx->saved_data["zero_centered_gamma"].toBool(), gamma, beta),
                                            kept, at::mm(dpre, w1).view(kept.sum.sizes()), d_sum, request, true);
      result[0] = n.d_in;
      if (has_branch) result[1] = n.d_in;
      result[2] = n.d_weight;
      result[3] = n.d_bias;
      result[8] = bias_grad_for_autograd(branch_bias, request.branch_bias);
      x = n.normed;
    } else if (ctx->needs_input_grad(0)) {
      result[0] = at::mm(dpre, w1).view(x.sizes());
    }
    result[4] = linear_param_grads(dpre, x.reshape({-1, in}), w1, torch::Tensor(), true, false, main_grads).weight;
    result[5] = bias_grad_for_autograd(b1, bias);
    return result;
  }

 private:
  static NormPrologue norm_of(bool has_norm, bool rms, double epsilon, bool zero_centered_gamma,
                              const std::optional<torch::Tensor>& gamma, const std::optional<torch::Tensor>& beta) {
    if (!has_norm) return NormPrologue{};
    return NormPrologue{norm_options_of(rms, epsilon, zero_centered_gamma, gamma->size(0)), *gamma,
                        beta.value_or(torch::Tensor())};
  }
};

}  // namespace

std::string fused_gelu_mlp_blocker(const torch::Tensor& x, const GeluMlpParams& p) {
  if (!p.main_grads || !p.main_grads->fusion()) return "gradient-accumulation fusion is off";
  if (p.main_grads->delays_wgrad_of(p.fc1_weight) || p.main_grads->delays_wgrad_of(p.fc2_weight))
    return "--delay-wgrad-compute holds the weight gradients";
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
    return strprintf("fc1's %lld output features (this rank's) are not a multiple of 8 (the GeLU kernels' 16-byte packs)",
                     static_cast<long long>(w1.size(0)));
  if (x.numel() == 0) return "no tokens";
  const auto on_device = [&x](const torch::Tensor& t) { return !t.defined() || t.device() == x.device(); };
  if (!x.is_cuda() || !on_device(w1) || !on_device(w2) || !on_device(p.fc1_bias) || !on_device(p.fc2_bias))
    return "not on a GPU";
  return "";
}

namespace {
std::optional<torch::Tensor> optional(const torch::Tensor& t) {
  return t.defined() ? std::optional<torch::Tensor>(t) : std::nullopt;
}
}  // namespace

torch::Tensor fused_gelu_mlp(const torch::Tensor& x, const GeluMlpParams& p) {
  const std::string blocker = fused_gelu_mlp_blocker(x, p);
  FP8TRON_CHECK(blocker.empty(), "fused GeLU MLP called where it does not apply: " + blocker);
  return FusedGeluMlp::apply(x, std::nullopt, std::nullopt, std::nullopt, p.fc1_weight, optional(p.fc1_bias), p.fc2_weight,
                             optional(p.fc2_bias), std::nullopt, false, 0.0, false, p.main_grads)[0];
}

ResidualOutput fused_norm_gelu_mlp(const ResidualStream& in, const NormPrologue& norm, const GeluMlpParams& p) {
  const std::string blocker = fused_gelu_mlp_blocker(in.residual, p);
  FP8TRON_CHECK(blocker.empty(), "fused GeLU MLP called where it does not apply: " + blocker);
  FP8TRON_CHECK(norm_prologue_applies(in.residual, in.branch, norm, in.branch_bias),
                "fused norm + GeLU MLP: the norm's kernels do not apply");
  const bool rms = norm.options.kind == Normalization::RMSNorm;
  const auto out = FusedGeluMlp::apply(in.residual, optional(in.branch), norm.weight, optional(rms ? torch::Tensor() : norm.bias),
                                       p.fc1_weight, optional(p.fc1_bias), p.fc2_weight, optional(p.fc2_bias),
                                       optional(in.branch_bias), rms, norm.options.epsilon,
                                       norm.options.zero_centered_gamma, p.main_grads);
  if (!in.branch.defined()) return {in.residual, out[0]};
  return {out[0], out[1]};
}

}  // namespace fp8tron
