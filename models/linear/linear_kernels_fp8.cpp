#include "models/linear/linear_kernels_fp8.h"

#include <ATen/cuda/CUDAContext.h>

#include <algorithm>

#include "core/error.h"
#include "fp8/forward_replay.h"
#include "fp8/norm_backward.h"
#include "models/mlp/fused_swiglu.h"

namespace fp8tron {

using fp8::Quantized;
using fp8::TensorRole;
using overlap::Operand;
using overlap::Range;

// What an operand of these kernels holds: the quantized rows (row-wise copy, sometimes the
// transposed one too) and, where blocks must be gathered in high precision, those rows.
struct Fp8LinearKernels::Block {
  enum class Kind { kInput, kGradOutput, kPartial } kind = Kind::kInput;
  std::shared_ptr<Quantized> q;
  torch::Tensor high;      // high-precision rows (block-scaled recipes: what wgrad's gathers move)
  bool high_wire = false;  // the wire is `high` (else the codes, and block scales)
};

// The norm fused into the input's cast: its input rows, statistics and parameters.
struct Fp8LinearKernels::Norm {
  bool rms = false;
  double eps = 1e-5;
  bool zero_centered = false;
  torch::Tensor gamma_param, beta_param;  // as the module holds them
  torch::Tensor gamma, beta;              // effective (gamma + 1 when zero-centred), contiguous
  torch::Tensor input, mean, rstd;        // input rows [L, h]; fp32 statistics
};

bool fused_norm_cast_available(const fp8::Fp8Site& site, const torch::Tensor& x, const torch::Tensor& gamma,
                               const torch::Tensor& beta) {
  const fp8::Fp8Engine& e = *site.engine;
  return fp8::path_of(e) == fp8::Path::kNative && fp8::recipe_kind(e.recipe()) == fp8::RecipeKind::kDelayed &&
         torch::GradMode::is_enabled() && site.parameter.requires_grad() && x.scalar_type() == torch::kBFloat16 &&
         gamma.scalar_type() == torch::kBFloat16 && (!beta.defined() || beta.scalar_type() == torch::kBFloat16);
}

Fp8LinearKernels::Fp8LinearKernels(torch::Tensor weight, torch::Tensor bias, fp8::Fp8Site& site, Communicator& tp,
                                   const overlap::TpLinearPlan& plan, fp8::Prologue prologue)
    : site_(site),
      engine_(*site.engine),
      tp_(tp),
      plan_(plan),
      prologue_(prologue),
      weight_param_(weight),
      weight_(weight.detach()),
      bias_(bias.defined() ? bias.detach() : bias) {
  // Amaxes are recorded for training steps only (evaluation must not move the scales), as fp8_linear.
  track_ = torch::GradMode::is_enabled() && weight.requires_grad();
  // A recomputed forward pass (activation recomputation, models/recompute/recompute.h) keeps what backward
  // needs but records no amax: the original pass did, with the same scales.
  record_ = track_ && !fp8::forward_replay_active();
  reduce_over_tp_ = [this](torch::Tensor& amax) { tp_.all_reduce(amax, ReduceOp::Max); };
}

void Fp8LinearKernels::fuse_norm(bool rms, const torch::Tensor& gamma, const torch::Tensor& beta, double eps,
                                 bool zero_centered_gamma) {
  norm_ = std::make_shared<Norm>();
  norm_->rms = rms;
  norm_->eps = eps;
  norm_->zero_centered = zero_centered_gamma;
  norm_->gamma_param = gamma;
  norm_->beta_param = beta;
  torch::NoGradGuard no_grad;
  norm_->gamma = (zero_centered_gamma ? gamma + 1 : gamma).detach().contiguous();
  norm_->beta = beta.defined() ? beta.detach().contiguous() : beta;
}

bool Fp8LinearKernels::tensor_scaled(TensorRole role) const {
  return fp8::scaling_mode(engine_.recipe(), role) == fp8::ScalingMode::kTensor;
}

int Fp8LinearKernels::sm_budget(const GemmOverlap& how) const {
  if (!how.enabled() || !how.sm_margin || fp8::path_of(engine_) != fp8::Path::kNative) return 0;
  const int sms = at::cuda::getDeviceProperties(engine_.device().index())->multiProcessorCount;
  return std::max(1, sms - how.num_sm);
}

const Quantized& Fp8LinearKernels::weight_q() {
  if (!weight_q_) weight_q_ = fp8::quantized_weight(site_, weight_param_, record_);
  return *weight_q_;
}

Operand Fp8LinearKernels::operand(std::shared_ptr<Block> block, std::vector<torch::Tensor> wire) const {
  const int64_t rows = block->q ? int64_t(block->q->view.rows) : block->high.size(0);
  return Operand{rows, std::move(wire), std::move(block)};
}

std::shared_ptr<Fp8LinearKernels::Block> Fp8LinearKernels::block_of(const Operand& op) {
  return std::static_pointer_cast<Block>(op.state);
}

// Rows of a tensor that the other ranks receive, quantized before they go: for tensorwise scaling
// with the amax of the whole (the shards' amaxes MAX-reduced over the group).
std::shared_ptr<Quantized> Fp8LinearKernels::quantize_gathered_rows(TensorRole role, const torch::Tensor& rows,
                                                                    bool record_amax) {
  return fp8::quantize_rows(engine_, site_, role, rows, /*rowwise=*/true, /*transposed=*/false, record_amax, {},
                            &reduce_over_tp_);
}

// ---- forward --------------------------------------------------------------------------------------

Operand Fp8LinearKernels::prepare_input(const torch::Tensor& x, bool to_gather) {
  input_dtype_ = x.scalar_type();
  auto b = std::make_shared<Block>();
  b->kind = Block::Kind::kInput;
  if (!to_gather) {
    // A row-parallel input stays on this rank: quantized as fp8_linear does, with the prologue.
    fp8::check_fp8_rows(site_, x.size(0));
    b->q = fp8::quantize_rows(engine_, site_, TensorRole::kInput, x, true, track_, record_, {prologue_, nullptr});
    if (track_ && prologue_ != fp8::Prologue::kNone) activation_input_ = x;
    return operand(b, {});
  }
  fp8::check_fp8_rows(site_, x.size(0));
  if (norm_) {
    // The fused norm+cast on the shard (the tile kernel writes the transposed copy too).
    Norm& n = *norm_;
    const int64_t h = x.size(1);
    n.input = x.contiguous();
    const auto floats = x.options().dtype(torch::kFloat32);
    if (!n.rms) n.mean = torch::empty({x.size(0)}, floats);
    n.rstd = torch::empty({x.size(0)}, floats);
    fp8::norm_row_stats(static_cast<const uint16_t*>(n.input.data_ptr()), size_t(x.size(0)), size_t(h), float(n.eps),
                        n.rms ? nullptr : n.mean.data_ptr<float>(), n.rstd.data_ptr<float>(),
                        at::cuda::getCurrentCUDAStream(x.device().index()).stream());
    fp8::TensorCastFusion fusion{fp8::Prologue::kLayerNorm, nullptr};
    fusion.norm = fp8::NormPrologue{n.rms ? nullptr : n.mean.data_ptr<float>(), n.rstd.data_ptr<float>(),
                                    static_cast<const uint16_t*>(n.gamma.data_ptr()),
                                    n.beta.defined() ? static_cast<const uint16_t*>(n.beta.data_ptr()) : nullptr};
    b->q = fp8::quantize_rows(engine_, site_, TensorRole::kInput, n.input, true, true, record_, fusion);
    b->q->data_t = torch::Tensor();  // only the row-wise codes travel; the gathered codes are transposed later
    b->q->view.data_t = nullptr;
    return operand(b, {b->q->data});
  }
  b->q = quantize_gathered_rows(TensorRole::kInput, x, record_);
  if (tensor_scaled(TensorRole::kInput)) return operand(b, {b->q->data});
  b->high = x.contiguous();  // wgrad's transposed copy is quantized from the gathered rows
  return operand(b, {b->q->data, b->q->scale_inv});
}

Operand Fp8LinearKernels::slice_rows(const Operand& op, int64_t begin, int64_t count) {
  const auto b = block_of(op);
  auto s = std::make_shared<Block>(*b);
  if (b->high.defined()) s->high = b->high.narrow(0, begin, count).contiguous();
  if (b->q && b->q->data.defined()) s->q = fp8::slice_rows(engine_, *b->q, begin, count);
  if (b->high_wire) return operand(s, {s->high});
  std::vector<torch::Tensor> wire = {s->q->data.contiguous()};
  if (op.wire.size() > 1) wire.push_back(s->q->scale_inv.contiguous());
  return operand(s, std::move(wire));
}

Operand Fp8LinearKernels::adopt(const Operand& local, std::vector<torch::Tensor> wire) {
  const auto l = block_of(local);
  auto b = std::make_shared<Block>();
  b->kind = l->kind;
  if (l->high_wire) {
    b->high = wire[0];
    b->high_wire = true;
    // Block-scaled dY arrives in high precision: its row-wise copy for dgrad is quantized here
    // (blocks lie within rows: the same codes as the gathered tensor's). An input gathered for
    // wgrad is quantized when the blocks are joined.
    if (l->kind == Block::Kind::kGradOutput)
      b->q = fp8::quantize_rows(engine_, site_, TensorRole::kGradOutput, b->high, true, false, false);
    return operand(b, std::move(wire));
  }
  // Codes (and block scales; partials carry their own tensor scale).
  b->q = fp8::rowwise_from_codes(engine_, *l->q, wire[0], wire.size() > 1 ? wire[1] : torch::Tensor());
  return operand(b, std::move(wire));
}

void Fp8LinearKernels::fprop(const Operand& x, Range rows, Range cols, torch::Tensor& out) {
  const auto b = block_of(x);
  const Quantized& w = weight_q();
  const bool all_rows = rows.begin == 0 && rows.count == x.rows;
  const bool all_cols = cols.begin == 0 && cols.count == weight_.size(0);
  const auto a = all_rows ? b->q : fp8::slice_rows(engine_, *b->q, rows.begin, rows.count);
  const auto wb = all_cols ? weight_q_ : fp8::slice_rows(engine_, w, cols.begin, cols.count);
  const torch::Tensor bias = bias_.defined() ? bias_.narrow(0, cols.begin, cols.count) : bias_;
  out.copy_(fp8::fp8_gemm(engine_, *a, false, *wb, false, bias, fp8::GemmKind::kFprop, out.scalar_type(), {}, false,
                          sm_budget(plan_.fprop)));
}

Operand Fp8LinearKernels::saved_input(const Operand& x, bool gathered_in_backward) {
  const auto b = block_of(x);
  if (!gathered_in_backward) {
    // Row-parallel: wgrad reads the transposed copy only.
    auto s = std::make_shared<Block>(*b);
    s->q = std::make_shared<Quantized>(*b->q);
    s->q->data = torch::Tensor();
    s->q->view.data = nullptr;
    s->q->dequantized = torch::Tensor();
    return operand(s, {});
  }
  if (tensor_scaled(TensorRole::kInput)) return x;  // the codes travel again
  auto s = std::make_shared<Block>();
  s->kind = b->kind;
  s->high = b->high;
  s->high_wire = true;
  return operand(s, {b->high});
}

// ---- backward -------------------------------------------------------------------------------------

Operand Fp8LinearKernels::prepare_grad_output(const torch::Tensor& dy, bool to_gather) {
  auto b = std::make_shared<Block>();
  b->kind = Block::Kind::kGradOutput;
  fp8::check_fp8_rows(site_, dy.size(0));
  if (to_gather) {
    // A row-parallel dY: every rank receives it for its dgrad and wgrad.
    if (!tensor_scaled(TensorRole::kGradOutput)) {
      // Block-scaled: wgrad needs the transposed copy of the gathered dY, whose blocks along tokens
      // cross the shards, so the rows travel in high precision (docs/overlap.md).
      b->high = dy.contiguous();
      b->high_wire = true;
      b->q = fp8::quantize_rows(engine_, site_, TensorRole::kGradOutput, b->high, true, false, false);
      return operand(b, {b->high});
    }
    b->q = quantize_gathered_rows(TensorRole::kGradOutput, dy.contiguous(), /*record_amax=*/true);
    return operand(b, {b->q->data});
  }
  // A column-parallel dY is whole on every rank: both copies, as fp8_linear's backward; the bias
  // gradient comes out of the cast where it can.
  fp8::TensorCastFusion fusion;
  const bool fused_db = bias_.defined() && fp8::path_of(engine_) == fp8::Path::kNative &&
                        !engine_.options().deterministic && tensor_scaled(TensorRole::kGradOutput);
  torch::Tensor rows = dy;
  if (fused_db) {
    rows = dy.contiguous();
    fused_db_ = torch::zeros({site_.out_features}, dy.options().dtype(torch::kFloat32));
    fusion.column_sums = fused_db_.data_ptr<float>();
  }
  b->q = fp8::quantize_rows(engine_, site_, TensorRole::kGradOutput, rows, true, true, true, fusion);
  b->high = rows;
  return operand(b, {});
}

void Fp8LinearKernels::dgrad(const Operand& dy, Range rows, Range cols, torch::Tensor& out) {
  const auto b = block_of(dy);
  const Quantized& w = weight_q();
  const bool all_rows = rows.begin == 0 && rows.count == dy.rows;
  const bool all_cols = cols.begin == 0 && cols.count == weight_.size(1);
  const auto a = all_rows ? b->q : fp8::slice_rows(engine_, *b->q, rows.begin, rows.count);
  const auto wt = all_cols ? weight_q_ : fp8::slice_cols_transposed(engine_, w, cols.begin, cols.count);
  out.copy_(fp8::fp8_gemm(engine_, *a, false, *wt, true, {}, fp8::GemmKind::kDgrad, out.scalar_type(), {}, false,
                          sm_budget(plan_.dgrad)));
}

Operand Fp8LinearKernels::join(const std::vector<Operand>& blocks, bool grad_output) {
  const TensorRole role = grad_output ? TensorRole::kGradOutput : TensorRole::kInput;
  auto j = std::make_shared<Block>();
  j->kind = grad_output ? Block::Kind::kGradOutput : Block::Kind::kInput;
  if (tensor_scaled(role)) {
    std::vector<const Quantized*> parts;
    for (const auto& op : blocks) parts.push_back(block_of(op)->q.get());
    j->q = fp8::transposed_from_rowwise_blocks(engine_, parts);
  } else {
    // Blocks along tokens cross the shards: the transposed copy of the gathered rows.
    std::vector<torch::Tensor> rows;
    for (const auto& op : blocks) rows.push_back(block_of(op)->high);
    const auto all = rows.size() == 1 ? rows[0] : torch::cat(rows, 0);
    j->q = fp8::quantize_rows(engine_, site_, role, all, false, true, false);
  }
  return operand(j, {});
}

overlap::WeightGrads Fp8LinearKernels::wgrad(const Operand& dy, const Operand& x, bool need_dw, bool need_db) {
  overlap::WeightGrads g;
  const auto d = block_of(dy);
  if (need_dw) {
    // dW [N, K] = dY^T [N, M] (X^T [K, M])^T; into the fp32 main gradient when the GEMM can
    // (gradient-accumulation fusion, as fp8_linear).
    const Quantized& xt = *block_of(x)->q;
    const torch::Tensor main_grad = weight_param_.grad();
    if (fp8::path_of(engine_) == fp8::Path::kNative && engine_.options().gradient_accumulation_fusion && main_grad.defined() &&
        main_grad.scalar_type() == torch::kFloat32 && main_grad.is_contiguous() && main_grad.sizes() == weight_param_.sizes()) {
      const bool overwrite = engine_.overwrite_main_grads() && site_.main_grad_generation != engine_.weight_generation();
      site_.main_grad_generation = engine_.weight_generation();
      fp8::fp8_gemm(engine_, *d->q, true, xt, true, {}, fp8::GemmKind::kWgrad, torch::kFloat32, main_grad, overwrite,
                    sm_budget(plan_.wgrad));
    } else {
      FP8TRON_CHECK(!engine_.overwrite_main_grads(), site_.name + ": the optimizer leaves this weight's gradient to the "
                                                      "wgrad GEMM, but it is not an fp32 main gradient");
      g.weight = fp8::fp8_gemm(engine_, *d->q, true, xt, true, {}, fp8::GemmKind::kWgrad, weight_.scalar_type(), {}, false,
                               sm_budget(plan_.wgrad));
    }
  }
  if (need_db && bias_.defined())
    g.bias = (fused_db_.defined() ? fused_db_ : d->high.sum(0, false, torch::kFloat32)).to(bias_.scalar_type());
  return g;
}

std::vector<torch::Tensor> Fp8LinearKernels::input_grads(torch::Tensor dx) {
  if (activation_input_.defined()) {
    if (prologue_ == fp8::Prologue::kSwiglu) return {fused_swiglu_backward(dx, activation_input_)};
    return {at::gelu_backward(dx, activation_input_, "tanh")};
  }
  if (!norm_) return {dx};
  // The fused norm's backward from the saved statistics, on this rank's rows.
  const Norm& n = *norm_;
  const bool need_dgamma = n.gamma_param.requires_grad(), need_dbeta = n.beta_param.defined() && n.beta_param.requires_grad();
  const auto g = engine_.norm_backward({dx, n.input, n.rms ? torch::Tensor() : n.mean, n.rstd, n.gamma, n.beta, need_dgamma,
                                     need_dbeta});
  std::vector<torch::Tensor> out = {g.dx, g.dgamma};
  if (!n.rms) out.push_back(g.dbeta);
  return out;
}

// ---- FP8 reduce-scatter ---------------------------------------------------------------------------

Operand Fp8LinearKernels::quantize_partial(const torch::Tensor& rows) {
  auto b = std::make_shared<Block>();
  b->kind = Block::Kind::kPartial;
  // Each rank scales its own partial (the output slot's scale for delayed scaling, its own amax
  // otherwise): the factors travel with the codes.
  b->q = fp8::quantize_rows(engine_, site_, TensorRole::kOutput, rows.contiguous(), true, false, record_);
  return operand(b, {b->q->data, b->q->scale_inv});
}

torch::Tensor Fp8LinearKernels::dequantize_partial(const Operand& block) {
  return fp8::dequantized_copy(engine_, *block_of(block)->q, false);
}

}  // namespace fp8tron
