#include "models/attention/fp8_attention.h"

#include <cmath>
#include <limits>

#include <ATen/cuda/CUDAContext.h>

#include "core/error.h"
#include "core/text.h"
#include "fp8/cudnn_sdpa.h"
#include "fp8/quantize.h"
#include "fp8/quantized_tensor.h"
#include "fp8/recipe.h"

namespace fp8tron {
namespace {

using fp8::Format;
constexpr float kE4M3Max = 448.0f;

// ---- the native path's casts -------------------------------------------------------------------
struct Fp8Cast {
  torch::Tensor codes, scale, scale_inv, amax;
};

fp8::Fp8TensorView fp8_tensor_view(const torch::Tensor& codes, void* scale_inv, Format format, int64_t cols) {
  fp8::Fp8TensorView v;
  v.data = codes.data_ptr();
  v.scale_inv = scale_inv;
  v.format = format;
  v.scaling_mode = fp8::ScalingMode::kTensor;
  v.rows = size_t(codes.numel() / cols);
  v.cols = size_t(cols);
  return v;
}

// Current scaling of a contiguous bf16 tensor whose last dimension is `cols`.
Fp8Cast cast_current_scaled(const torch::Tensor& x, int64_t cols, Format format, fp8::CudaStream stream) {
  const auto floats = x.options().dtype(torch::kFloat32);
  Fp8Cast c{torch::empty(x.sizes(), x.options().dtype(torch::kUInt8)), torch::empty({1}, floats),
         torch::empty({1}, floats), torch::empty({1}, floats)};
  auto v = fp8_tensor_view(c.codes, c.scale_inv.data_ptr(), format, cols);
  v.scale = c.scale.data_ptr<float>();
  v.amax = c.amax.data_ptr<float>();
  fp8::quantize_tensor_current(reinterpret_cast<const uint16_t*>(x.data_ptr()), v, {}, stream);
  return c;
}

torch::Tensor dequantize_fp8_codes(const torch::Tensor& codes, float* scale_inv, Format format, int64_t cols,
                               fp8::CudaStream stream) {
  auto y = torch::empty(codes.sizes(), codes.options().dtype(torch::kBFloat16));
  fp8::dequantize(fp8_tensor_view(codes, scale_inv, format, cols), false, reinterpret_cast<uint16_t*>(y.data_ptr()), stream);
  return y;
}

torch::Tensor cudnn_workspace(size_t bytes, const torch::Device& device) {
  return torch::empty({int64_t(std::max<size_t>(bytes, 1))}, torch::TensorOptions().device(device).dtype(torch::kUInt8));
}

// ---- the emulated path's fake quantization --------------------------------------------------------
torch::ScalarType torch_fp8_dtype(Format f) { return f == Format::kE4M3 ? torch::kFloat8_e4m3fn : torch::kFloat8_e5m2; }

// The values x rounds to when cast with `scale` (saturating) and dequantized with its inverse.
torch::Tensor fp8_fake_quantize(const torch::Tensor& x, const torch::Tensor& scale, Format f) {
  const double max = fp8::max_finite(f);
  return (x * scale).clamp(-max, max).to(torch_fp8_dtype(f)).to(torch::kFloat32) * scale.reciprocal();
}

// Current scaling's scale (scale_math.h): fp8_max / amax, 1 for an amax of 0, inf or NaN.
torch::Tensor current_fp8_scale(const torch::Tensor& x, float fp8_max) {
  const auto amax = x.abs().amax();
  return torch::where((amax > 0) & torch::isfinite(amax), fp8_max / amax, torch::ones_like(amax));
}

// [b, heads, s, d] scores of the causal attention, masked.
torch::Tensor fp8_causal_scores(const torch::Tensor& q, const torch::Tensor& k, double scale) {
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  const int64_t s = q.size(2);
  auto future = torch::ones({s, s}, torch::TensorOptions().device(q.device()).dtype(torch::kBool)).triu(1);
  return scores.masked_fill(future, -std::numeric_limits<float>::infinity());
}

torch::Tensor repeat_head_groups(const torch::Tensor& x, int64_t per_group) {
  return per_group > 1 ? x.repeat_interleave(per_group, 1) : x;
}
torch::Tensor sum_head_groups(const torch::Tensor& x, int64_t groups) {
  const int64_t per_group = x.size(1) / groups;
  return per_group > 1 ? x.view({x.size(0), groups, per_group, x.size(2), x.size(3)}).sum(2) : x;
}

// [s, b, heads, d] -> fp32 [b, heads, s, d], and back.
torch::Tensor fp32_bhsd(const torch::Tensor& x) { return x.to(torch::kFloat32).permute({1, 2, 0, 3}); }
torch::Tensor from_bhsd(const torch::Tensor& x, torch::ScalarType dtype) {
  return x.permute({2, 0, 1, 3}).contiguous().to(dtype);
}

// ---- the autograd node -----------------------------------------------------------------------------
struct Fp8AttentionFunction : torch::autograd::Function<Fp8AttentionFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t attention) {
    const auto* a = reinterpret_cast<const Fp8Attention*>(attention);
    Fp8Attention::Saved saved;
    auto out = a->forward_pass(q, k, v, saved);
    ctx->saved_data["attention"] = attention;
    ctx->saved_data["tensors"] = std::vector<torch::Tensor>{saved.q, saved.k, saved.v, saved.o, saved.q_inv,
                                                            saved.k_inv, saved.v_inv, saved.o_inv, saved.stats};
    ctx->saved_data["dims"] = std::vector<int64_t>{saved.s, saved.b, saved.heads, saved.groups, saved.d,
                                                   int64_t(saved.dtype)};
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* a = reinterpret_cast<const Fp8Attention*>(ctx->saved_data["attention"].toInt());
    const auto t = ctx->saved_data["tensors"].toTensorVector();
    const auto dims = ctx->saved_data["dims"].toIntVector();
    Fp8Attention::Saved saved{t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8],
                              dims[0], dims[1], dims[2], dims[3], dims[4], torch::ScalarType(dims[5])};
    auto g = a->backward_pass(grads[0], saved);
    return {g[0], g[1], g[2], torch::Tensor()};
  }
};

}  // namespace

Fp8Attention::Fp8Attention(std::shared_ptr<fp8::Fp8Engine> engine, std::shared_ptr<fp8::Fp8AttentionSite> site,
                           double scale, int64_t head_dim, bool emulate)
    : engine_(std::move(engine)), site_(std::move(site)), scale_(scale) {
  FP8TRON_CHECK(engine_ && site_, "FP8 attention needs its engine and site");
  emulate_ = emulate || engine_->options().attention_emulated || !engine_->device().is_cuda();
  if (!emulate_ && !fp8::cudnn_sdpa_built())
    throw UserError("--fp8-dot-product-attention: this build has no cuDNN frontend (its headers come from "
                    "scripts/setup.sh); run ./scripts/setup.sh and rebuild, or drop the flag");
  if (!emulate_ && at::cuda::getDeviceProperties(engine_->device().index())->major == 9 && head_dim != 128)
    throw UserError(strprintf("--fp8-dot-product-attention: on Hopper cuDNN's FP8 attention backward takes a head "
                              "dimension of 128 only, and this model's is %lld (--kv-channels, or --hidden-size / "
                              "--num-attention-heads); drop the flag",
                              (long long)head_dim));
  const auto& recipe = engine_->recipe();
  grad_format_ = fp8::tensor_format(recipe, fp8::TensorRole::kGradOutput);
  if (grad_format_ != Format::kE4M3 && grad_format_ != Format::kE5M2)
    throw UserError("--fp8-dot-product-attention needs --fp8-format e4m3 or hybrid (cuDNN's FP8 attention has no HiF8)");
  int margin = 0;
  if (const auto* d = std::get_if<fp8::DelayedScaling>(&recipe)) margin = d->margin;
  grad_scaled_max_ = std::ldexp(fp8::max_finite(grad_format_), -margin);
}

torch::Tensor Fp8Attention::forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) const {
  return Fp8AttentionFunction::apply(q, k, v, reinterpret_cast<int64_t>(this));
}

torch::Tensor Fp8Attention::forward_pass(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         Saved& saved) const {
  saved.s = q.size(0), saved.b = q.size(1), saved.heads = q.size(2), saved.groups = k.size(2), saved.d = q.size(3);
  saved.dtype = q.scalar_type();
  FP8TRON_CHECK(saved.heads % saved.groups == 0, "FP8 attention: heads must be a multiple of the key/value groups");
  return emulate_ ? forward_emulated(q, k, v, saved) : forward_native(q, k, v, saved);
}

std::vector<torch::Tensor> Fp8Attention::backward_pass(const torch::Tensor& grad, const Saved& saved) const {
  torch::NoGradGuard no_grad;
  return emulate_ ? backward_emulated(grad, saved) : backward_native(grad, saved);
}

torch::Tensor Fp8Attention::scales_from(const torch::Tensor& amax) const {
  return torch::where((amax > 0) & torch::isfinite(amax), grad_scaled_max_ / amax, torch::ones_like(amax));
}

torch::Tensor Fp8Attention::gradient_scales() const { return scales_from(engine_->attention().amax(*site_)); }

bool Fp8Attention::calibrating() const { return !engine_->attention().calibrated(*site_); }

void Fp8Attention::record_gradient_amaxes(const torch::Tensor& amaxes) const {
  auto now = engine_->attention().amax_now(*site_);
  now.copy_(torch::fmax(now, amaxes));  // fmax: a NaN amax is no amax (scale_math.h's rule)
  engine_->attention().note_backward(*site_);
}

// ---- native: cuDNN's fused FP8 attention ---------------------------------------------------------
torch::Tensor Fp8Attention::forward_native(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                           Saved& saved) const {
  const int64_t s = saved.s, b = saved.b, h = saved.heads, d = saved.d;
  const auto stream = fp8::current_stream(q.device());
  const auto bf16 = [](const torch::Tensor& x) { return x.to(torch::kBFloat16).contiguous(); };
  const Fp8Cast qc = cast_current_scaled(bf16(q), d, Format::kE4M3, stream);
  const Fp8Cast kc = cast_current_scaled(bf16(k), d, Format::kE4M3, stream);
  const Fp8Cast vc = cast_current_scaled(bf16(v), d, Format::kE4M3, stream);
  const auto floats = q.options().dtype(torch::kFloat32);
  const auto scale_s = torch::full({1}, kE4M3Max, floats), descale_s = torch::full({1}, 1.0f / kE4M3Max, floats);
  const auto scale_o = vc.scale * 0.5, o_inv = vc.scale_inv * 2.0;  // |O| <= amax(V): attention_scaling.h
  auto o = torch::empty({s, b, h, d}, q.options().dtype(torch::kUInt8));
  auto stats = torch::empty({b, h, s}, floats);
  auto amaxes = torch::empty({2}, floats);
  const fp8::SdpaShape shape{b, h, saved.groups, s, d, float(scale_)};
  const int device = q.device().index();
  auto ws = cudnn_workspace(fp8::sdpa_fp8_forward_workspace(shape, device), q.device());
  fp8::SdpaFp8ForwardArgs a;
  a.q = qc.codes.data_ptr(), a.k = kc.codes.data_ptr(), a.v = vc.codes.data_ptr();
  a.descale_q = qc.scale_inv.data_ptr<float>(), a.descale_k = kc.scale_inv.data_ptr<float>();
  a.descale_v = vc.scale_inv.data_ptr<float>(), a.descale_s = descale_s.data_ptr<float>();
  a.scale_s = scale_s.data_ptr<float>(), a.scale_o = scale_o.data_ptr<float>();
  a.o = o.data_ptr(), a.stats = stats.data_ptr<float>();
  a.amax_s = amaxes.data_ptr<float>(), a.amax_o = amaxes.data_ptr<float>() + 1;
  fp8::sdpa_fp8_forward(shape, a, ws.data_ptr(), device, stream);
  saved.q = qc.codes, saved.k = kc.codes, saved.v = vc.codes, saved.o = o;
  saved.q_inv = qc.scale_inv, saved.k_inv = kc.scale_inv, saved.v_inv = vc.scale_inv, saved.o_inv = o_inv;
  saved.stats = stats;
  return dequantize_fp8_codes(o, o_inv.data_ptr<float>(), Format::kE4M3, d, stream).view({s, b, h * d}).to(saved.dtype);
}

std::vector<torch::Tensor> Fp8Attention::backward_native(const torch::Tensor& grad, const Saved& saved) const {
  const int64_t s = saved.s, b = saved.b, h = saved.heads, g = saved.groups, d = saved.d;
  const auto stream = fp8::current_stream(grad.device());
  const Fp8Cast dc = cast_current_scaled(grad.to(torch::kBFloat16).contiguous(), d, grad_format_, stream);
  const auto floats = grad.options().dtype(torch::kFloat32);
  const auto scale_s = torch::full({1}, kE4M3Max, floats), descale_s = torch::full({1}, 1.0f / kE4M3Max, floats);
  auto scales = gradient_scales().contiguous();  // dQ, dK, dV, dP
  auto inv = scales.reciprocal();
  const auto codes = grad.options().dtype(torch::kUInt8);
  auto dq = torch::empty({s, b, h, d}, codes), dk = torch::empty({s, b, g, d}, codes), dv = torch::empty({s, b, g, d}, codes);
  auto amaxes = torch::empty({fp8::kAttentionAmaxes}, floats);
  const fp8::SdpaShape shape{b, h, g, s, d, float(scale_)};
  const int device = grad.device().index();
  auto ws = cudnn_workspace(fp8::sdpa_fp8_backward_workspace(shape, grad_format_, device), grad.device());
  float* am = amaxes.data_ptr<float>();
  fp8::SdpaFp8BackwardArgs a;
  a.q = saved.q.data_ptr(), a.k = saved.k.data_ptr(), a.v = saved.v.data_ptr(), a.o = saved.o.data_ptr();
  a.d_o = dc.codes.data_ptr(), a.stats = saved.stats.data_ptr<float>();
  a.descale_q = saved.q_inv.data_ptr<float>(), a.descale_k = saved.k_inv.data_ptr<float>();
  a.descale_v = saved.v_inv.data_ptr<float>(), a.descale_o = saved.o_inv.data_ptr<float>();
  a.descale_do = dc.scale_inv.data_ptr<float>(), a.descale_s = descale_s.data_ptr<float>();
  a.scale_s = scale_s.data_ptr<float>();
  a.dq = dq.data_ptr(), a.dk = dk.data_ptr(), a.dv = dv.data_ptr();
  a.amax_dq = am + fp8::kAmaxDQ, a.amax_dk = am + fp8::kAmaxDK, a.amax_dv = am + fp8::kAmaxDV;
  a.amax_dp = am + fp8::kAmaxDP;
  const auto launch = [&] {
    float* sc = scales.data_ptr<float>();
    a.descale_dp = inv.data_ptr<float>() + fp8::kAmaxDP;
    a.scale_dq = sc + fp8::kAmaxDQ, a.scale_dk = sc + fp8::kAmaxDK, a.scale_dv = sc + fp8::kAmaxDV;
    a.scale_dp = sc + fp8::kAmaxDP;
    fp8::sdpa_fp8_backward(shape, grad_format_, a, ws.data_ptr(), device, stream);
  };
  if (calibrating()) {
    // No step has given amaxes yet: learn them from this pass, then run it again with their scales
    // (fp8/attention_scaling.h). dQ's and dK's amaxes depend on dP's codes: one more round would
    // refine them by the rounding of one E5M2 step at most.
    launch();
    scales = scales_from(amaxes).contiguous();
    inv = scales.reciprocal();
  }
  launch();
  record_gradient_amaxes(amaxes);
  float* iv = inv.data_ptr<float>();
  const auto out = [&](const torch::Tensor& c, int64_t slot) {
    return dequantize_fp8_codes(c, iv + slot, grad_format_, d, stream).to(saved.dtype);
  };
  return {out(dq, fp8::kAmaxDQ), out(dk, fp8::kAmaxDK), out(dv, fp8::kAmaxDV)};
}

// ---- emulated: the same casts as fake quantization ----------------------------------------------
torch::Tensor Fp8Attention::forward_emulated(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                             Saved& saved) const {
  const auto qf = fp32_bhsd(q), kf = fp32_bhsd(k), vf = fp32_bhsd(v);
  const int64_t per_group = saved.heads / saved.groups;
  const auto scale_v = current_fp8_scale(vf, kE4M3Max);
  saved.q = fp8_fake_quantize(qf, current_fp8_scale(qf, kE4M3Max), Format::kE4M3);
  saved.k = fp8_fake_quantize(kf, current_fp8_scale(kf, kE4M3Max), Format::kE4M3);
  saved.v = fp8_fake_quantize(vf, scale_v, Format::kE4M3);
  auto scores = fp8_causal_scores(saved.q, repeat_head_groups(saved.k, per_group), scale_);
  saved.stats = torch::logsumexp(scores, -1, true);
  const auto s_scale = torch::full({}, kE4M3Max, scores.options());
  const auto probs = fp8_fake_quantize((scores - saved.stats).exp(), s_scale, Format::kE4M3);
  const auto o = torch::matmul(probs, repeat_head_groups(saved.v, per_group));
  saved.o = fp8_fake_quantize(o, scale_v * 0.5, Format::kE4M3);
  return from_bhsd(saved.o, saved.dtype).view({saved.s, saved.b, saved.heads * saved.d});
}

std::vector<torch::Tensor> Fp8Attention::backward_emulated(const torch::Tensor& grad, const Saved& saved) const {
  const int64_t per_group = saved.heads / saved.groups;
  const auto go = fp32_bhsd(grad.reshape({saved.s, saved.b, saved.heads, saved.d}));
  const auto d_o = fp8_fake_quantize(go, current_fp8_scale(go, fp8::max_finite(grad_format_)), grad_format_);
  const auto k = repeat_head_groups(saved.k, per_group), v = repeat_head_groups(saved.v, per_group);
  const auto scores = fp8_causal_scores(saved.q, k, scale_);
  const auto probs = (scores - saved.stats).exp();
  const auto probs_fp8 = fp8_fake_quantize(probs, torch::full({}, kE4M3Max, probs.options()), Format::kE4M3);
  const auto delayed = gradient_scales().to(torch::kFloat32);
  const bool calibrate = calibrating();
  // The scale of a tensor: the delayed one, or while calibrating the one of its own amax.
  const auto scale_of = [&](const torch::Tensor& x, int64_t slot) {
    return calibrate ? scales_from(x.abs().amax()) : delayed[slot];
  };
  // Flash attention's backward: dV = P^T dO, dP = scale P * (dO V^T - rowsum(dO * O)) (the gradient
  // of the scores Q K^T, which cuDNN quantizes as "dP"), dQ = dP K, dK = dP^T Q.
  const auto dv = sum_head_groups(torch::matmul(probs_fp8.transpose(-2, -1), d_o), saved.groups);
  const auto dp = probs * (torch::matmul(d_o, v.transpose(-2, -1)) - (d_o * saved.o).sum(-1, true)) * scale_;
  const auto dp_fp8 = fp8_fake_quantize(dp, scale_of(dp, fp8::kAmaxDP), grad_format_);
  const auto dq = torch::matmul(dp_fp8, k);
  const auto dk = sum_head_groups(torch::matmul(dp_fp8.transpose(-2, -1), saved.q), saved.groups);
  record_gradient_amaxes(torch::stack({dq.abs().amax(), dk.abs().amax(), dv.abs().amax(), dp.abs().amax()}));
  const auto out = [&](const torch::Tensor& x, int64_t slot) {
    return from_bhsd(fp8_fake_quantize(x, scale_of(x, slot), grad_format_), saved.dtype);
  };
  return {out(dq, fp8::kAmaxDQ), out(dk, fp8::kAmaxDK), out(dv, fp8::kAmaxDV)};
}

}  // namespace fp8tron
