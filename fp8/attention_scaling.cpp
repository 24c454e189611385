#include "fp8/attention_scaling.h"

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::fp8 {

std::shared_ptr<Fp8AttentionSite> AttentionScaling::add_site(const std::string& name) {
  FP8TRON_CHECK(!buffers_.amax.defined(), "FP8 attention sites must all be registered before the first forward pass");
  auto site = std::make_shared<Fp8AttentionSite>();
  site->name = name;
  site->index = int64_t(sites_.size());
  sites_.push_back(site);
  calibrated_.push_back(0);
  seen_.push_back(0);
  return site;
}

AttentionScaling::Buffers& AttentionScaling::buffers() {
  if (!buffers_.amax.defined()) {
    const auto floats = torch::TensorOptions().device(device_).dtype(torch::kFloat32);
    buffers_.amax = torch::zeros({int64_t(sites_.size()), kAttentionAmaxes}, floats);
    buffers_.amax_now = torch::zeros_like(buffers_.amax);
  }
  return buffers_;
}

torch::Tensor AttentionScaling::amax(const Fp8AttentionSite& site) { return buffers().amax[site.index]; }
torch::Tensor AttentionScaling::amax_now(const Fp8AttentionSite& site) { return buffers().amax_now[site.index]; }

void AttentionScaling::end_step(const std::function<void(torch::Tensor&)>& reduce) {
  if (sites_.empty()) return;
  torch::NoGradGuard no_grad;
  auto& b = buffers();
  auto now = b.amax_now.view({-1});
  if (reduce) reduce(now);
  // A NaN amax (a NaN gradient) keeps the previous scale, as the linears' delayed scaling does.
  b.amax.copy_(torch::where(b.amax_now > 0, b.amax_now, b.amax));
  b.amax_now.zero_();
  for (size_t i = 0; i < sites_.size(); ++i) {
    calibrated_[i] |= seen_[i];
    seen_[i] = 0;
  }
}

torch::Tensor AttentionScaling::site_state(const Fp8AttentionSite& site) { return amax(site).to(torch::kCPU).clone(); }

void AttentionScaling::load_site_state(const Fp8AttentionSite& site, const torch::Tensor& state) {
  if (state.dim() != 1 || state.numel() != kAttentionAmaxes)
    throw UserError(strprintf("checkpoint: the FP8 attention state of %s has %lld values, not %lld (amaxes of dQ, dK, "
                              "dV and dP); was it written by another fp8tron version?",
                              site.name.c_str(), (long long)state.numel(), (long long)kAttentionAmaxes));
  torch::NoGradGuard no_grad;
  amax(site).copy_(state.to(torch::kFloat32));
  amax_now(site).zero_();
  calibrated_[size_t(site.index)] = (state.to(torch::kFloat32) > 0).any().item<bool>();
}

AttentionScaling::Saved AttentionScaling::capture() {
  if (sites_.empty()) return {};
  return {torch::cat({buffers().amax, buffers().amax_now}), calibrated_, seen_};
}

void AttentionScaling::restore(const Saved& saved) {
  if (!saved.buffers.defined()) return;
  torch::NoGradGuard no_grad;
  auto& b = buffers();
  const int64_t n = int64_t(sites_.size());
  b.amax.copy_(saved.buffers.narrow(0, 0, n));
  b.amax_now.copy_(saved.buffers.narrow(0, n, n));
  calibrated_ = saved.calibrated;
  seen_ = saved.seen;
}

}  // namespace fp8tron::fp8
