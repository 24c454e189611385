#include "models/moe/aux_loss.h"

#include "models/moe/moe_context.h"
#include "models/moe/routing.h"

namespace fp8tron::moe {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AttachAuxLoss : torch::autograd::Function<AttachAuxLoss> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& activation, const torch::Tensor& loss,
                               const MoeContext* context) {
    // The loss's graph stays alive through its saved copy; the scale is read at backward time.
    ctx->save_for_backward({loss});
    ctx->saved_data["context"] = int64_t(reinterpret_cast<intptr_t>(context));
    return activation;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto* context = reinterpret_cast<const MoeContext*>(intptr_t(ctx->saved_data["context"].toInt()));
    const auto loss = ctx->get_saved_variables()[0];
    return {grad[0], torch::full_like(loss, context->aux_grad_scale()), {}};
  }
};
}  // namespace

AuxScores aux_loss_scores(const torch::Tensor& logits, int64_t topk, MoeScoreFunction score_function) {
  torch::Tensor scores;
  if (score_function == MoeScoreFunction::kSoftmax) {
    scores = torch::softmax(logits, -1, torch::kFloat32);
  } else {
    auto l = logits.to(torch::kFloat32);
    scores = score_function == MoeScoreFunction::kSigmoid ? torch::sigmoid(l) : torch::nn::functional::softplus(l).sqrt();
    scores = scores / (scores.sum(-1, true) + 1e-20);
  }
  auto indices = std::get<1>(scores.detach().topk(topk, 1));
  return AuxScores{scores, selection_mask(scores, indices)};
}

torch::Tensor switch_load_balancing_loss(const torch::Tensor& scores, const torch::Tensor& tokens_per_expert,
                                         double total_tokens, int64_t topk, int64_t num_experts, double coeff) {
  auto per_expert = scores.sum(0);
  return (per_expert * tokens_per_expert.to(per_expert.scalar_type())).sum() *
         (double(num_experts) * coeff / (double(topk) * total_tokens * total_tokens));
}

torch::Tensor z_loss(const torch::Tensor& logits, double coeff) {
  return torch::logsumexp(logits, -1).square().mean() * coeff;
}

torch::Tensor attach_aux_loss(const torch::Tensor& activation, const torch::Tensor& loss, const MoeContext& context) {
  return AttachAuxLoss::apply(activation, loss, &context);
}

}  // namespace fp8tron::moe
