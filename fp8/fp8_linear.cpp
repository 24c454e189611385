#include "fp8/fp8_linear.h"
#include "fp8/held_wgrad.h"
#include "fp8/norm_backward.h"
#include "fp8/swiglu_backward.h"

#include <ATen/cuda/CUDAContext.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <optional>


#include "core/error.h"
#include "core/text.h"
#include "fp8/forward_replay.h"
#include "fp8/gemm.h"
#include "fp8/linear_ops.h"
#include "fp8/quantize.h"
#include "fp8/quantized_tensor.h"
#include "fp8/quantize_reference.h"
#include "fp8/scaling_state.h"

namespace fp8tron::fp8 {

using torch::autograd::variable_list;

namespace {

// out [a_rows, b_rows] = A B^T (+ bias), A and B being the row-wise or transposed copies of two
// quantized tensors with the same inner dimension. With `accumulate_into` (fp32, native path) the
// product is added to it in the GEMM's epilogue instead (the wgrad into the main gradient), or
// written into it with `overwrite` (fp32 or bf16: a place chosen by the caller).
// `sm_count` > 0 caps the SMs of a native GEMM that runs beside SM-based communication.
torch::Tensor gemm(Fp8Engine& e, const Quantized& a, bool a_transposed, const Quantized& b, bool b_transposed,
                   const torch::Tensor& bias, GemmKind kind, torch::ScalarType out_dtype,
                   const torch::Tensor& accumulate_into = {}, bool overwrite = false, int sm_count = 0) {
  if (path_of(e) != Path::kNative) {
    const auto& A = a_transposed ? a.dequantized_t : a.dequantized;
    const auto& B = b_transposed ? b.dequantized_t : b.dequantized;
    auto y = bias.defined() ? torch::addmm(bias.to(A.scalar_type()), A, B.t()) : torch::mm(A, B.t());
    if (accumulate_into.defined() && overwrite) return accumulate_into.copy_(y);
    return y.to(out_dtype);
  }
  const RowMajorMatrix am = a_transposed ? transposed_matrix(a.view) : rowwise_matrix(a.view);
  const RowMajorMatrix bm = b_transposed ? transposed_matrix(b.view) : rowwise_matrix(b.view);
  GemmConfig config;
  config.fast_accumulation = use_fast_accumulation(e.recipe(), kind);
  config.sm_count = sm_count;
  if (accumulate_into.defined()) {
    const bool fp32 = accumulate_into.scalar_type() == torch::kFloat32;
    FP8TRON_CHECK((fp32 || (overwrite && accumulate_into.scalar_type() == torch::kBFloat16)) &&
                      accumulate_into.is_contiguous() && accumulate_into.size(0) == am.rows &&
                      accumulate_into.size(1) == bm.rows && !bias.defined(),
                  "gemm: the target must be a contiguous fp32 (or, overwritten, bf16) [a_rows, b_rows] tensor");
    config.accumulate = !overwrite;
    gemm_nt(e.gemm_handle(), am, bm, accumulate_into.data_ptr(), fp32 ? DType::kFP32 : DType::kBF16, bm.rows, config,
            current_stream(e.device()));
    return accumulate_into;
  }
  auto y = torch::empty({am.rows, bm.rows}, torch::TensorOptions().device(e.device()).dtype(torch::kBFloat16));
  torch::Tensor bias_bf16;
  if (bias.defined()) {
    bias_bf16 = bias.to(torch::kBFloat16).contiguous();
    config.bias = bias_bf16.data_ptr();
    config.bias_dtype = DType::kBF16;
  }
  gemm_nt(e.gemm_handle(), am, bm, y.data_ptr(), DType::kBF16, bm.rows, config, current_stream(e.device()));
  return out_dtype == torch::kBFloat16 ? y : y.to(out_dtype);
}

}  // namespace

namespace {

void check_rows(const Fp8Site& site, int64_t rows) {
  if (rows % 16 != 0)
    throw UserError(strprintf("FP8 linear %s: %lld tokens per micro-batch (sequence x micro-batch, per tensor-parallel "
                              "rank) is not a multiple of 16, which FP8 GEMMs need; change --seq-length or "
                              "--micro-batch-size",
                              site.name.c_str(), (long long)rows));
}

// Backward of fp8_linear: inputs (x, weight, bias) in that order.
struct Fp8LinearBackward : public torch::autograd::Node {
  Fp8Site* site = nullptr;
  std::shared_ptr<Quantized> input;   // transposed copy only (wgrad)
  std::shared_ptr<Quantized> weight;  // both copies (dgrad uses the transposed one)
  // --fp8-transposes recast: where `weight` and `input` are null, their transposed copies are cast
  // in backward from these, with the forward's scales (the step's delayed scales, or the same
  // values' amax), so the GEMMs read the codes a kept copy would hold.
  torch::Tensor weight_source;  // the weight
  torch::Tensor input_source;   // the input of the fused activation (an MLP's fc1 output)
  Prologue input_prologue = Prologue::kNone;
  InputRebuild input_rebuild;   // or the input again (a norm's output, from the norm's input)
  // --no-fp8-wgrad (the engine's fp8_wgrad off): the wgrad GEMM runs in bf16 from the unquantized
  // input: held here, or made again from input_source (its prologue applied), input_rebuild or
  // the norm's saved input.
  bool fp8_wgrad = true;
  torch::Tensor input_hp;
  bool ran = false;
  torch::Tensor activation_input;     // Prologue::kGeluTanh: the GeLU's input (its backward reads it)
  torch::Tensor weight_param;         // the parameter: its fp32 main gradient takes the wgrad directly
  // This node's output is the input of a GeLU fused into the next FP8 linear, which hands back the
  // gradient of the GeLU's *output*; this node applies GeLU's derivative (fused into its gradient
  // cast when it can). Holds that output (the GeLU input).
  torch::Tensor deferred_gelu_input;
  bool swiglu = false;                // Prologue::kSwiglu: activation_input is the [.., 2f] fc1 output
  // The same hand-over for a SwiGLU fused into the next FP8 linear (fc2): that node hands back the
  // gradient of the SwiGLU's output, [rows, f], in the first rows * f elements of a gradient of this
  // node's output shape [rows, 2f] (`swiglu_deferred` on the fc2 side); this node applies SwiGLU's
  // backward inside its gradient cast (Prologue::kSwigluBackward) or, where that cast does not
  // apply, first. Holds this node's output h = [gate | up].
  torch::Tensor deferred_swiglu_input;
  bool swiglu_deferred = false;
  // fp8_layernorm_linear: the norm's input, statistics and affine parameters (the node's inputs 3
  // and 4 are gamma and beta); backward runs the LayerNorm backward on the dgrad output.
  struct Norm {
    torch::Tensor input, mean, rstd, gamma, beta;  // input [rows, H]; mean/rstd fp32 [rows]; RMSNorm: no mean, beta
  };
  std::optional<Norm> norm;
  std::vector<int64_t> input_shape;
  torch::ScalarType input_dtype = torch::kBFloat16, weight_dtype = torch::kBFloat16, bias_dtype = torch::kBFloat16;
  bool has_bias = false;

  std::string name() const override { return "Fp8LinearBackward"; }
  // Autograd releases a node's state right after its backward ran; a held weight gradient still
  // reads it, so its closure releases it once it ran.
  bool holding = false;
  void release_variables() override {
    if (!holding) release_state();
  }
  void release_state() {
    input.reset();
    weight.reset();
    weight_source = torch::Tensor();
    input_source = torch::Tensor();
    input_rebuild = nullptr;
    input_hp = torch::Tensor();
    activation_input = torch::Tensor();
    weight_param = torch::Tensor();
    deferred_gelu_input = torch::Tensor();
    deferred_swiglu_input = torch::Tensor();
    norm.reset();
  }

  variable_list apply(variable_list&& grads) override {
    FP8TRON_CHECK(!ran, "Fp8LinearBackward ran twice (retain_graph is not supported for FP8 linears)");
    ran = true;
    Fp8Engine& e = *site->engine;
    const bool need_dgamma = norm && task_should_compute_output(3), need_dbeta = norm && task_should_compute_output(4);
    const bool need_dx = task_should_compute_output(0) || need_dgamma || need_dbeta, need_dw = task_should_compute_output(1);
    const bool need_db = has_bias && task_should_compute_output(2);
    variable_list out(5);
    if (!grads[0].defined()) return out;
    auto dy = grads[0].reshape({-1, site->out_features});
    TensorCastFusion fusion;
    torch::Tensor gelu_input;
    if (deferred_gelu_input.defined()) {
      // The incoming gradient is the GeLU output's: dY = dGeLU * gelu'(this node's output).
      gelu_input = deferred_gelu_input.reshape({-1, site->out_features}).contiguous();
      const bool fusable = path_of(e) != Path::kCpu && need_dw && fp8_wgrad &&
                           scaling_mode(e.recipe(), TensorRole::kGradOutput) == ScalingMode::kTensor;
      if (fusable) {
        dy = dy.contiguous();
        fusion.prologue = Prologue::kGeluTanhBackward;
        fusion.aux = static_cast<const uint16_t*>(gelu_input.data_ptr());
        FP8TRON_CHECK(gelu_input.scalar_type() == torch::kBFloat16 && dy.scalar_type() == torch::kBFloat16,
                      "fused GeLU backward needs bf16 tensors");
      } else {
        dy = at::gelu_backward(dy, gelu_input, "tanh");
      }
    }
    torch::Tensor swiglu_input;
    if (deferred_swiglu_input.defined()) {
      const int64_t f = site->out_features / 2;
      swiglu_input = deferred_swiglu_input.reshape({-1, site->out_features}).contiguous();
      const int64_t rows = swiglu_input.size(0);
      const auto dswiglu = grads[0].contiguous().view(-1).narrow(0, 0, rows * f).view({rows, f});
      // The fused cast serves the native delayed-scaling path (fc2 defers only there, or on the
      // CPU), and needs the transposed copy that the wgrad reads (a bf16 wgrad reads dY itself).
      if (path_of(e) == Path::kNative && need_dw && fp8_wgrad) {
        dy = dswiglu;
        fusion.prologue = Prologue::kSwigluBackward;
        fusion.aux = static_cast<const uint16_t*>(swiglu_input.data_ptr());
      } else {
        dy = e.swiglu_backward(dswiglu, swiglu_input);
      }
    }
    // The bias gradient comes out of the cast kernel when it can (one read of dY fewer).
    torch::Tensor db;
    const bool fused_db = need_db && need_dw && fp8_wgrad && path_of(e) == Path::kNative && !e.options().deterministic &&
                          scaling_mode(e.recipe(), TensorRole::kGradOutput) == ScalingMode::kTensor;
    if (fused_db) {
      db = torch::zeros({site->out_features}, dy.options().dtype(torch::kFloat32));
      fusion.column_sums = db.data_ptr<float>();
    }
    // The transposed copy only for an FP8 wgrad; none at all when neither GEMM reads FP8 codes.
    const bool dy_t = need_dw && fp8_wgrad;
    std::shared_ptr<Quantized> dyq;
    if (need_dx || dy_t) dyq = quantize(e, *site, TensorRole::kGradOutput, dy, need_dx, dy_t, /*record_amax=*/true, fusion);
    if (need_dx) {  // dX [M, K] = dY [M, N] * (W^T [K, N])^T
      if (swiglu_deferred) {
        // For the producer (deferred_swiglu_input): dX [M, f] in the first M * f elements of a
        // gradient shaped as x, [..., 2f]; the rest is never read.
        auto packed = torch::empty(input_shape, dy.options().dtype(input_dtype));
        const int64_t rows = dy.size(0), f = site->in_features;
        gemm(e, *dyq, false, weight_t(), true, {}, GemmKind::kDgrad, input_dtype,
             packed.view(-1).narrow(0, 0, rows * f).view({rows, f}), /*overwrite=*/true);
        out[0] = packed;
      } else if (swiglu) {
        out[0] = gemm(e, *dyq, false, weight_t(), true, {}, GemmKind::kDgrad, input_dtype);
        out[0] = e.swiglu_backward(out[0], activation_input.reshape({-1, 2 * site->in_features})).view(input_shape);
      } else {
        out[0] = gemm(e, *dyq, false, weight_t(), true, {}, GemmKind::kDgrad, input_dtype).view(input_shape);
        // GeLU's derivative, unless the producing FP8 linear applies it (activation_input unset).
        if (activation_input.defined()) out[0] = at::gelu_backward(out[0], activation_input, "tanh");
      }
      if (norm) {
        const int64_t rows = norm->input.size(0), h = norm->input.size(1);
        // The installed norm backward (fp8/norm_backward.h): the models' fused kernel on GPUs.
        const auto g = e.norm_backward({out[0].reshape({rows, h}), norm->input, norm->mean, norm->rstd, norm->gamma,
                                      norm->beta, need_dgamma, need_dbeta});
        const torch::Tensor dx = task_should_compute_output(0) ? g.dx : torch::Tensor();
        out[3] = g.dgamma;
        out[4] = g.dbeta;
        out[0] = dx.defined() ? dx.view(input_shape) : torch::Tensor();
      }
      if (weight_source.defined()) weight.reset();  // a recast copy lives for its GEMM only
    }
    // --delay-wgrad-compute (fp8/held_wgrad.h): the wgrad GEMM later, from the same codes.
    const bool hold = need_dw && site->wgrad_queue && weight_param.defined();
    if (hold) {
      auto self = std::static_pointer_cast<Fp8LinearBackward>(shared_from_this());
      run_or_hold_wgrad(
          site->wgrad_queue,
          [self, dyq, dy] {
            accumulate_param_grad(self->weight_param, self->weight_grad(dyq.get(), dy));
            self->holding = false;
            self->release_state();
          },
          {weight_param});
    } else if (need_dw) {
      out[1] = weight_grad(dyq.get(), dy);
    }
    if (need_db) {
      // Unfused with a fused GeLU- or SwiGLU-backward cast: the bias gradient is that of the cast's
      // output.
      torch::Tensor g = dy;
      if (!fused_db && fusion.prologue == Prologue::kGeluTanhBackward) g = at::gelu_backward(dy, gelu_input, "tanh");
      if (!fused_db && fusion.prologue == Prologue::kSwigluBackward) g = e.swiglu_backward(dy, swiglu_input);
      out[2] = (fused_db ? db : g.sum(0, false, torch::kFloat32)).to(bias_dtype);
    }
    if (hold) holding = true;  // the held work releases the state
    else release_variables();
    return out;
  }

  // The transposed copies the GEMMs read: kept from the forward pass, or cast now.
  const Quantized& weight_t() {
    if (!weight)
      weight = quantize(*site->engine, *site, TensorRole::kWeight, weight_source.detach(), /*rowwise=*/false,
                        /*transposed=*/true, /*record_amax=*/false, {}, nullptr, /*count_stats=*/false);
    return *weight;
  }
  const Quantized& input_t() {
    if (!input) {
      torch::Tensor x = input_source;
      if (!x.defined()) {
        torch::NoGradGuard no_grad;
        x = input_rebuild().reshape({-1, site->in_features});
      }
      input = quantize(*site->engine, *site, TensorRole::kInput, x, /*rowwise=*/false, /*transposed=*/true,
                       /*record_amax=*/false, TensorCastFusion{input_prologue, nullptr}, nullptr, /*count_stats=*/false);
    }
    return *input;
  }

  // The unquantized input the bf16 wgrad reads (--no-fp8-wgrad), [M, K].
  torch::Tensor input_bf16() {
    torch::NoGradGuard no_grad;
    const int64_t k = site->in_features;
    if (input_hp.defined()) return input_hp.reshape({-1, k});
    if (input_source.defined()) {
      if (input_prologue == Prologue::kGeluTanh) return at::gelu(input_source, "tanh").reshape({-1, k});
      const auto h = input_source.reshape({-1, 2 * k});  // SwiGLU: [gate | up]
      return at::silu(h.narrow(1, 0, k)) * h.narrow(1, k, k);
    }
    if (input_rebuild) return input_rebuild().reshape({-1, k});
    FP8TRON_CHECK(norm.has_value(), site->name + ": no input kept for the bf16 wgrad");
    auto y = norm->input.to(torch::kFloat32);
    if (norm->mean.defined()) y = y - norm->mean.unsqueeze(1);
    y = y * norm->rstd.unsqueeze(1) * norm->gamma.to(torch::kFloat32);
    if (norm->beta.defined()) y = y + norm->beta.to(torch::kFloat32);
    return y.to(norm->input.scalar_type());
  }

  // Gradient-accumulation fusion (Megatron's, with TE): when the parameter's gradient is an fp32
  // main-gradient buffer, the wgrad GEMM adds into it and autograd gets no weight gradient
  // (AccumulateGrad then has nothing to add, and its hooks still run). Saves writing dW in bf16 and
  // the separate read-add-write of the fp32 buffer. Returns that buffer (undefined: no fusion) and
  // in `overwrite` whether this GEMM writes it instead: with the optimizer not zeroing these
  // gradients, the step's first backward overwrites.
  torch::Tensor fused_main_grad(bool& overwrite) {
    Fp8Engine& e = *site->engine;
    torch::Tensor main_grad = weight_param.defined() ? weight_param.grad() : torch::Tensor();
    if (path_of(e) == Path::kNative && e.options().gradient_accumulation_fusion && main_grad.defined() &&
        main_grad.scalar_type() == torch::kFloat32 && main_grad.is_contiguous() &&
        main_grad.sizes() == weight_param.sizes()) {
      overwrite = e.overwrite_main_grads() && site->main_grad_generation != e.weight_generation();
      site->main_grad_generation = e.weight_generation();
      return main_grad;
    }
    FP8TRON_CHECK(!e.overwrite_main_grads(), site->name + ": the optimizer leaves this weight's gradient to the "
                                             "wgrad GEMM, but it is not an fp32 main gradient");
    return {};
  }

  // dW [N, K] = dY^T [N, M] * (X^T [K, M])^T: what autograd is to add (undefined where the GEMM
  // added it to the main gradient). --no-fp8-wgrad: dY^T [N, M] * X [M, K] in bf16 (fp32
  // accumulation) from the unquantized `dy` and input.
  torch::Tensor weight_grad(const Quantized* dyq, const torch::Tensor& dy) {
    Fp8Engine& e = *site->engine;
    bool overwrite = false;
    torch::Tensor main_grad = fused_main_grad(overwrite);
    if (!fp8_wgrad) {
      const auto x = input_bf16();
      const auto g = dy.reshape({-1, site->out_features});
      if (!main_grad.defined()) return torch::mm(g.t(), x).to(weight_dtype);
      at::addmm_out(main_grad, main_grad, g.t(), x, torch::kFloat32, overwrite ? 0.0 : 1.0);
      return {};
    }
    if (!main_grad.defined()) return gemm(e, *dyq, true, input_t(), true, {}, GemmKind::kWgrad, weight_dtype);
    gemm(e, *dyq, true, input_t(), true, {}, GemmKind::kWgrad, torch::kFloat32, main_grad, overwrite);
    return {};
  }
};

}  // namespace

// ---- the autograd function -------------------------------------------------------------------------

namespace {

// What fp8_layernorm_linear adds to a linear: the norm's parameters (as the caller holds them),
// the effective gamma (zero-centred: gamma + 1), and the statistics of x.
struct NormInputs {
  torch::Tensor gamma_param, beta_param;  // graph inputs 3 and 4
  torch::Tensor gamma, beta, mean, rstd;
};

// Whether fc1's node (`producer`, of fc1's output x) can take over the backward of the activation
// fused into fc2's cast: x is its only output, in bf16, and nothing was handed to it already.
bool takes_hand_over(const Fp8LinearBackward& producer, const torch::Tensor& x) {
  return x.output_nr() == 0 && !producer.deferred_gelu_input.defined() && !producer.deferred_swiglu_input.defined() &&
         x.scalar_type() == torch::kBFloat16;
}

// ... for SwiGLU, also where fc1's gradient cast can fuse the backward (native delayed scaling,
// each half of x whole 128-column tiles). On the CPU, where CI runs it, the hand-over runs too,
// with the unfused backward in fc1's node.
bool swiglu_hand_over_applies(const Fp8LinearBackward& producer, const torch::Tensor& x) {
  if (!takes_hand_over(producer, x)) return false;
  const Fp8Engine& e = *producer.site->engine;
  if (path_of(e) == Path::kCpu) return true;
  return path_of(e) == Path::kNative && recipe_kind(e.recipe()) == RecipeKind::kDelayed &&
         producer.site->out_features % 256 == 0;
}

torch::Tensor linear_impl(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, Fp8Site& site,
                          Prologue prologue, const NormInputs* norm, const InputRebuild& rebuild_x = {}) {
  Fp8Engine& e = *site.engine;
  const int64_t x_width = prologue == Prologue::kSwiglu ? 2 * site.in_features : site.in_features;
  FP8TRON_CHECK(x.size(-1) == x_width && weight.size(0) == site.out_features && weight.size(1) == site.in_features,
                "fp8_linear: shapes do not match the site " + site.name);
  const bool grad_mode = torch::GradMode::is_enabled();
  const bool need_dw = grad_mode && weight.requires_grad();
  auto wants_grad = [](const torch::Tensor& t) { return t.defined() && t.requires_grad(); };
  const bool track = grad_mode && (x.requires_grad() || need_dw || wants_grad(bias) ||
                                   (norm && (wants_grad(norm->gamma_param) || wants_grad(norm->beta_param))));
  const auto x2d = x.reshape({-1, x_width});
  check_rows(site, x2d.size(0));
  // --fp8-transposes recast: the weight's transposed copy is cast in backward (the parameter's
  // values; gathered FP8 codes are kept as they come), and so is the input's where the node holds
  // its source anyway (the activation's input) or the caller can rebuild it; any other input's
  // source would be held in bf16.
  const bool recast = !e.options().keep_transposes;
  const bool fp8_wgrad = e.options().fp8_wgrad;
  const bool recast_weight = recast && weight.is_leaf() && !weight_from_gathered_codes(site);
  const bool activation = prologue == Prologue::kGeluTanh || prologue == Prologue::kSwiglu;
  const bool recast_input = recast && fp8_wgrad && need_dw && !norm &&
                            ((activation && x.is_contiguous()) || (prologue == Prologue::kNone && rebuild_x));

  std::shared_ptr<Quantized> xq, wq;
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    // Amaxes are recorded for training steps only: evaluation must not move the scales.
    TensorCastFusion fusion{prologue, nullptr};
    if (norm) {
      fusion.norm = NormPrologue{norm->mean.defined() ? norm->mean.data_ptr<float>() : nullptr, norm->rstd.data_ptr<float>(),
                                 static_cast<const uint16_t*>(norm->gamma.data_ptr()),
                                 norm->beta.defined() ? static_cast<const uint16_t*>(norm->beta.data_ptr()) : nullptr};
    }
    // A recomputed forward pass (activation recomputation) records nothing: the original pass did.
    const bool record = track && !forward_replay_active();
    xq = quantize(e, site, TensorRole::kInput, x2d.detach(), true, need_dw && fp8_wgrad, /*record_amax=*/record, fusion);
    wq = recast_weight ? quantize(e, site, TensorRole::kWeight, weight.detach(), true, false, record)
                       : quantized_weight(site, weight, /*record_amax=*/record);
    y = gemm(e, *xq, false, *wq, false, bias.defined() ? bias.detach() : bias, GemmKind::kFprop, x.scalar_type());
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = site.out_features;
    // Not a view: autograd attaches this node to y as to any function's fresh output.
    y = at::_unsafe_view(y, shape);
  }
  if (!track) return y;

  // Keep only what backward reads: X's transposed copy (wgrad) and the weight.
  xq->data = torch::Tensor();
  xq->view.data = nullptr;
  xq->dequantized = torch::Tensor();
  auto node = std::shared_ptr<Fp8LinearBackward>(new Fp8LinearBackward(), torch::autograd::deleteNode);
  node->site = &site;
  node->input = need_dw && fp8_wgrad && !recast_input ? xq : nullptr;
  node->weight = recast_weight ? nullptr : wq;
  if (recast_weight) node->weight_source = weight.detach();
  if (recast_input && activation) {
    // (Forward still casts both copies, with the fused kernel: the codes the recast reproduces.)
    node->input_source = x2d.detach();
    node->input_prologue = prologue;
  } else if (recast_input) {
    node->input_rebuild = rebuild_x;
  }
  if (need_dw && !fp8_wgrad) {
    // The bf16 wgrad's input: from what is held anyway where it can be (the activation's input,
    // the caller's rebuild, the norm's input), else the input itself, as Transformer Engine keeps it.
    node->fp8_wgrad = false;
    if (activation) {
      node->input_source = x2d.detach();
      node->input_prologue = prologue;
    } else if (rebuild_x) {
      node->input_rebuild = rebuild_x;
    } else if (!norm) {
      node->input_hp = x2d.detach();
    }
  }
  node->input_shape = x.sizes().vec();
  node->input_dtype = x.scalar_type();
  node->weight_dtype = weight.scalar_type();
  node->has_bias = bias.defined();
  if (prologue == Prologue::kSwiglu) {
    // When x comes straight from another FP8 linear (fc1), that node applies SwiGLU's backward
    // inside its own gradient cast (no bf16 gradient of x); otherwise this node applies it.
    auto producer = std::dynamic_pointer_cast<Fp8LinearBackward>(x.grad_fn());
    if (producer && swiglu_hand_over_applies(*producer, x)) {
      producer->deferred_swiglu_input = x.detach();
      node->swiglu_deferred = true;
    } else {
      node->activation_input = x.detach();
      node->swiglu = true;
    }
  }
  if (prologue == Prologue::kGeluTanh) {
    // When x comes straight from another FP8 linear, that node applies GeLU's derivative inside
    // its own gradient cast (no bf16 dGeLU-input tensor); otherwise this node applies it.
    auto producer = std::dynamic_pointer_cast<Fp8LinearBackward>(x.grad_fn());
    if (producer && takes_hand_over(*producer, x)) {
      producer->deferred_gelu_input = x.detach();  // this node hands back dGeLU-output as is
    } else {
      node->activation_input = x.detach();
    }
  }
  if (need_dw && weight.is_leaf()) node->weight_param = weight;
  if (bias.defined()) node->bias_dtype = bias.scalar_type();
  torch::Tensor gamma_param, beta_param;
  if (norm) {
    node->norm = Fp8LinearBackward::Norm{x2d.detach().contiguous(), norm->mean, norm->rstd, norm->gamma, norm->beta};
    gamma_param = norm->gamma_param;
    beta_param = norm->beta_param;
  }
  node->set_next_edges(torch::autograd::collect_next_edges(x, weight, bias, gamma_param, beta_param));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace

torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, Fp8Site& site,
                         Prologue prologue, const InputRebuild& rebuild_x) {
  return linear_impl(x, weight, bias, site, prologue, nullptr, rebuild_x);
}

bool hands_over_swiglu_backward(const torch::Tensor& h) {
  const auto producer = std::dynamic_pointer_cast<Fp8LinearBackward>(h.grad_fn());
  return producer && producer->deferred_swiglu_input.defined();
}

bool keeps_input_copy(const torch::Tensor& y) {
  const auto producer = std::dynamic_pointer_cast<Fp8LinearBackward>(y.grad_fn());
  FP8TRON_CHECK(producer != nullptr, "keeps_input_copy: the tensor is not an FP8 linear's output");
  return producer->input != nullptr;
}

torch::Tensor fp8_norm_linear(const torch::Tensor& x, bool rms, const torch::Tensor& gamma, const torch::Tensor& beta,
                              double eps, bool zero_centered_gamma, const torch::Tensor& weight, const torch::Tensor& bias,
                              Fp8Site& site) {
  Fp8Engine& e = *site.engine;
  const int64_t h = site.in_features;
  const torch::Tensor effective_gamma = zero_centered_gamma ? gamma + 1 : gamma;
  // The fused cast is the delayed-scaling tile kernel (training: the transposed copy exists).
  const bool fusable = path_of(e) == Path::kNative && recipe_kind(e.recipe()) == RecipeKind::kDelayed &&
                       torch::GradMode::is_enabled() && weight.requires_grad() && x.scalar_type() == torch::kBFloat16 &&
                       gamma.scalar_type() == torch::kBFloat16 && (!beta.defined() || beta.scalar_type() == torch::kBFloat16);
  if (!fusable) {
    const auto normed = rms ? at::rms_norm(x, {h}, effective_gamma, eps) : at::layer_norm(x, {h}, effective_gamma, beta, eps);
    return linear_impl(normed, weight, bias, site, Prologue::kNone, nullptr);
  }
  NormInputs n;
  n.gamma_param = gamma;
  n.beta_param = beta;
  n.gamma = effective_gamma.detach().contiguous();
  n.beta = beta.defined() ? beta.detach().contiguous() : beta;
  const auto x2d = x.detach().reshape({-1, h}).contiguous();
  const auto floats = torch::TensorOptions().device(x.device()).dtype(torch::kFloat32);
  if (!rms) n.mean = torch::empty({x2d.size(0)}, floats);
  n.rstd = torch::empty({x2d.size(0)}, floats);
  norm_row_stats(static_cast<const uint16_t*>(x2d.data_ptr()), size_t(x2d.size(0)), size_t(h), float(eps),
                 rms ? nullptr : n.mean.data_ptr<float>(), n.rstd.data_ptr<float>(), current_stream(x.device()));
  return linear_impl(x, weight, bias, site, Prologue::kLayerNorm, &n);
}

// ---- pieces for linears computed in row blocks (linear_ops.h) ------------------------------------------

namespace {

// The high-precision values of one copy of a quantized tensor (fp32 on the CPU, bf16 on the GPU).
torch::Tensor dequantize_view(Fp8Engine& e, const Fp8TensorView& v, bool t) {
  const int64_t r = int64_t(t ? v.cols : v.rows), c = int64_t(t ? v.rows : v.cols);
  if (path_of(e) == Path::kCpu) {
    auto out = torch::empty({r, c}, torch::kFloat32);
    reference::dequantize_to_float(v, t, out.data_ptr<float>());
    return out;
  }
  auto out = torch::empty({r, c}, torch::TensorOptions().device(e.device()).dtype(torch::kBFloat16));
  dequantize(v, t, static_cast<uint16_t*>(out.data_ptr()), current_stream(e.device()));
  return out;
}

// Rows [begin, begin + count) of a [rows, cols] scale grid stored for `mode` (fp8_tensor.h).
torch::Tensor slice_scale_rows(ScalingMode mode, const torch::Tensor& scales, size_t rows, size_t cols, int64_t begin,
                               int64_t count) {
  const ScaleLayout l = scale_layout(mode, rows, cols);
  const auto grid = scales.view({int64_t(l.outer), int64_t(l.ld)});
  switch (mode) {
    case ScalingMode::kTensor: return scales;
    case ScalingMode::kBlock1x128: {  // M-major: rows are the inner index, padded to 4
      const ScaleLayout n = scale_layout(mode, size_t(count), cols);
      auto out = torch::zeros({int64_t(n.outer), int64_t(n.ld)}, scales.options());
      out.narrow(1, 0, count).copy_(grid.narrow(1, begin, count));
      return out.view({-1});
    }
    case ScalingMode::kBlock128x128:
      FP8TRON_CHECK(begin % int64_t(kBlockLen) == 0, "a 128x128-scaled slice must start at a block boundary");
      return grid.narrow(0, begin / int64_t(kBlockLen), int64_t(ceil_div(size_t(count), kBlockLen))).reshape({-1});
    case ScalingMode::kMxfp8: return grid.narrow(0, begin, count).reshape({-1});
  }
  return scales;
}

}  // namespace


std::shared_ptr<Quantized> quantize_rows(Fp8Engine& e, const Fp8Site& site, TensorRole role, torch::Tensor x2d, bool rowwise,
                                         bool transposed, bool record_amax, TensorCastFusion fusion,
                                         const AmaxReducer* reduce_amax) {
  const bool current = recipe_kind(e.recipe()) == RecipeKind::kTensorwise;
  return quantize(e, site, role, std::move(x2d), rowwise, transposed, record_amax, fusion, current ? reduce_amax : nullptr);
}

std::shared_ptr<Quantized> rowwise_from_codes(Fp8Engine& e, const Quantized& like, torch::Tensor codes, torch::Tensor scale_inv) {
  auto q = std::make_shared<Quantized>();
  Fp8TensorView& v = q->view;
  v.format = like.view.format;
  v.scaling_mode = like.view.scaling_mode;
  v.rows = size_t(codes.size(0));
  v.cols = size_t(codes.size(1));
  q->data = codes.contiguous();
  FP8TRON_CHECK(scale_inv.defined() || v.scaling_mode == ScalingMode::kTensor, "block-scaled codes need their scales");
  q->scale_inv = scale_inv.defined() ? scale_inv.contiguous() : like.scale_inv;
  v.data = q->data.data_ptr();
  v.scale_inv = q->scale_inv.data_ptr();
  if (path_of(e) != Path::kNative) q->dequantized = dequantize_view(e, v, false);
  return q;
}

std::shared_ptr<Quantized> slice_rows(Fp8Engine&, const Quantized& q, int64_t begin, int64_t count) {
  FP8TRON_CHECK(q.data.defined(), "slice_rows needs the row-wise copy");
  auto s = std::make_shared<Quantized>();
  Fp8TensorView& v = s->view;
  v.format = q.view.format;
  v.scaling_mode = q.view.scaling_mode;
  v.rows = size_t(count);
  v.cols = q.view.cols;
  s->data = q.data.narrow(0, begin, count);
  s->scale_inv = slice_scale_rows(v.scaling_mode, q.scale_inv, q.view.rows, q.view.cols, begin, count);
  v.data = s->data.data_ptr();
  v.scale_inv = s->scale_inv.data_ptr();
  if (q.dequantized.defined()) s->dequantized = q.dequantized.narrow(0, begin, count);
  return s;
}

std::shared_ptr<Quantized> slice_cols_transposed(Fp8Engine&, const Quantized& q, int64_t begin, int64_t count) {
  FP8TRON_CHECK(q.data_t.defined(), "slice_cols_transposed needs the transposed copy");
  auto s = std::make_shared<Quantized>();
  Fp8TensorView& v = s->view;
  v.format = q.view.format;
  v.scaling_mode = q.view.scaling_mode;
  v.rows = q.view.rows;
  v.cols = size_t(count);
  s->data_t = q.data_t.narrow(0, begin, count);
  v.data_t = s->data_t.data_ptr();
  switch (v.scaling_mode) {
    case ScalingMode::kTensor:
      s->scale_inv = q.scale_inv;
      v.scale_inv = s->scale_inv.data_ptr();
      break;
    default:  // block modes: the transposed copy's own scales (scale_inv_t, the grid of the
              // [cols, rows] matrix; 128x128 included), its rows [begin, begin + count)
      s->scale_inv_t = slice_scale_rows(v.scaling_mode, q.scale_inv_t, q.view.cols, q.view.rows, begin, count);
      v.scale_inv_t = s->scale_inv_t.data_ptr();
      break;
  }
  if (q.dequantized_t.defined()) s->dequantized_t = q.dequantized_t.narrow(0, begin, count);
  return s;
}

std::shared_ptr<Quantized> transposed_from_rowwise_blocks(Fp8Engine& e, const std::vector<const Quantized*>& blocks) {
  FP8TRON_CHECK(!blocks.empty() && blocks[0]->view.scaling_mode == ScalingMode::kTensor,
                "the transposed copy comes from row-wise codes under tensor scaling only");
  std::vector<torch::Tensor> codes;
  for (const Quantized* b : blocks) codes.push_back(b->data);
  auto q = std::make_shared<Quantized>();
  const auto joined = codes.size() == 1 ? codes[0] : torch::cat(codes, 0);
  q->data_t = joined.t().contiguous();
  q->scale_inv = blocks[0]->scale_inv;
  Fp8TensorView& v = q->view;
  v.format = blocks[0]->view.format;
  v.scaling_mode = ScalingMode::kTensor;
  v.rows = size_t(joined.size(0));
  v.cols = size_t(joined.size(1));
  v.data_t = q->data_t.data_ptr();
  v.scale_inv = q->scale_inv.data_ptr();
  if (path_of(e) != Path::kNative) q->dequantized_t = dequantize_view(e, v, true);
  return q;
}

std::shared_ptr<Quantized> weight_from_codes(Fp8Engine& e, const Fp8Site& site) {
  FP8TRON_CHECK(scaling_mode(e.recipe(), TensorRole::kWeight) == ScalingMode::kTensor, "FP8 parameters need tensor scaling");
  auto q = std::make_shared<Quantized>();
  Fp8TensorView& v = q->view;
  v.format = tensor_format(e.recipe(), TensorRole::kWeight);
  v.scaling_mode = ScalingMode::kTensor;
  v.rows = size_t(site.out_features);
  v.cols = size_t(site.in_features);
  q->data = site.codes.view({site.out_features, site.in_features});
  q->data_t = q->data.t().contiguous();
  q->scale_inv = site.codes_scale_inv;
  v.data = q->data.data_ptr();
  v.data_t = q->data_t.data_ptr();
  v.scale_inv = q->scale_inv.data_ptr();
  if (path_of(e) != Path::kNative) {
    q->dequantized = dequantize_view(e, v, false);
    q->dequantized_t = dequantize_view(e, v, true);
  }
  return q;
}

torch::Tensor fp8_gemm(Fp8Engine& e, const Quantized& a, bool a_transposed, const Quantized& b, bool b_transposed,
                       const torch::Tensor& bias, GemmKind kind, torch::ScalarType out_dtype,
                       const torch::Tensor& accumulate_into, bool overwrite, int sm_count) {
  return gemm(e, a, a_transposed, b, b_transposed, bias, kind, out_dtype, accumulate_into, overwrite, sm_count);
}


torch::Tensor dequantized_copy(Fp8Engine& e, const Quantized& q, bool transposed) {
  const auto& cached = transposed ? q.dequantized_t : q.dequantized;
  return cached.defined() ? cached : dequantize_view(e, q.view, transposed);
}

void check_fp8_rows(const Fp8Site& site, int64_t rows) { check_rows(site, rows); }

}  // namespace fp8tron::fp8
