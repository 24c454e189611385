#include "trainer/fp8_param_gather.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "fp8/recipe.h"

namespace fp8tron {
namespace {

torch::ScalarType fp8_dtype(fp8::Format format) {
  FP8TRON_CHECK(format == fp8::Format::kE4M3 || format == fp8::Format::kE5M2, "FP8 parameters are E4M3 or E5M2");
  return format == fp8::Format::kE4M3 ? torch::kFloat8_e4m3fn : torch::kFloat8_e5m2;
}

// max |x| without NaNs (fp8/scale_math.h's amax rule), as a 1-element fp32 tensor; 0 when empty.
torch::Tensor amax_of(const torch::Tensor& x) {
  if (x.numel() == 0) return torch::zeros({1}, x.options().dtype(torch::kFloat32));
  auto a = x.abs();
  return torch::where(torch::isnan(a), torch::zeros_like(a), a).max().reshape({1});
}

// fp8/scale_math.h's scale_from_amax on the device: fp8_max / max(amax, epsilon); 1 for an amax of
// 0, inf or NaN; FLT_MAX when the quotient overflows; optionally rounded down to a power of two.
torch::Tensor scale_from_amax(const torch::Tensor& amax, float fp8_max, bool power_2, float epsilon) {
  auto a = torch::clamp_min(amax, epsilon);
  const auto usable = torch::isfinite(a).logical_and(a > 0);
  auto scale = torch::where(usable, fp8_max / a, torch::ones_like(a));
  scale = torch::where(torch::isinf(scale), torch::full_like(scale, std::numeric_limits<float>::max()), scale);
  if (power_2) scale = scale.view(torch::kInt32).bitwise_and(int32_t(0xFF800000u)).view(torch::kFloat32);
  return scale;
}

}  // namespace

torch::Tensor cast_to_fp8_codes(const torch::Tensor& x, const torch::Tensor& scale, fp8::Format format) {
  const float max = fp8::max_finite(format);
  return (x.to(torch::kFloat32) * scale).clamp(-max, max).to(fp8_dtype(format)).view(torch::kUInt8);
}

torch::Tensor decode_fp8_codes(const torch::Tensor& codes, const torch::Tensor& scale_inv, fp8::Format format,
                               torch::ScalarType dtype) {
  return (codes.view(fp8_dtype(format)).to(torch::kFloat32) * scale_inv).to(dtype);
}

Fp8ParamGather::Fp8ParamGather(std::shared_ptr<fp8::Fp8Engine> engine) : engine_(std::move(engine)) {}

std::vector<torch::Tensor> Fp8ParamGather::params() const {
  std::vector<torch::Tensor> out;
  for (const auto& site : engine_->sites()) out.push_back(site->parameter);
  return out;
}

BytePublish Fp8ParamGather::publish(const OptimizerDomain& domain) {
  const auto base = domain.model_params();
  const auto* begin = static_cast<const char*>(base.data_ptr());
  const auto* end = begin + base.numel() * base.element_size();
  auto d = std::make_unique<DomainWeights>();
  d->group = domain.groups().dp;
  d->name = domain.groups().name;
  BytePublish b;
  for (const auto& site : engine_->sites()) {
    const auto& p = site->parameter;
    const auto* at = static_cast<const char*>(p.data_ptr());
    if (at < begin || at >= end) continue;  // another domain's weight
    const int64_t offset = (at - begin) / int64_t(base.element_size());
    FP8TRON_CHECK(offset + p.numel() <= base.numel(), site->name + ": weight outside the flat buffer");
    d->entries.push_back({site, offset, p.numel(), torch::ones({1}, p.options().dtype(torch::kFloat32))});
    b.params.push_back(p);
  }
  FP8TRON_CHECK(!d->entries.empty(), "no FP8 weights in the " + domain.groups().name + " domain");
  std::sort(d->entries.begin(), d->entries.end(), [](const Entry& x, const Entry& y) { return x.offset < y.offset; });
  DomainWeights* weights = d.get();
  domains_.push_back(std::move(d));
  b.encode = [this, weights](const torch::Tensor& main, torch::Tensor& codes, int64_t offset) {
    encode(*weights, main, codes, offset);
  };
  b.decode = [this, weights](const torch::Tensor& codes, int64_t offset, int64_t numel) {
    decode(*weights, codes, offset, numel);
  };
  return b;
}

std::string Fp8ParamGather::describe() const {
  std::string out;
  for (const auto& d : domains_)
    out += (out.empty() ? "" : ", ") + std::to_string(d->entries.size()) + " in the " + d->name + " domain";
  return out;
}

// This rank's elements [offset, offset + main.numel()) of the domain's weights, to codes: the amaxes
// of every weight's part here, one MAX all-reduce over the domain's data-parallel group, the scales,
// the casts.
void Fp8ParamGather::encode(DomainWeights& d, const torch::Tensor& main, torch::Tensor& codes, int64_t offset) {
  torch::NoGradGuard no_grad;
  fp8::Fp8Engine& e = *engine_;
  const int64_t end = offset + main.numel();
  std::vector<torch::Tensor> parts, amaxes;
  for (const Entry& en : d.entries) {
    const int64_t lo = std::max(en.offset, offset), hi = std::min(en.offset + en.numel, end);
    parts.push_back(hi > lo ? main.narrow(0, lo - offset, hi - lo) : main.narrow(0, 0, 0));
    amaxes.push_back(amax_of(parts.back()));
  }
  auto amax = torch::cat(amaxes);
  if (d.group->size() > 1) d.group->all_reduce(amax, ReduceOp::Max);
  const fp8::Format format = fp8::tensor_format(e.recipe(), fp8::TensorRole::kWeight);
  const bool delayed = fp8::recipe_kind(e.recipe()) == fp8::RecipeKind::kDelayed;
  for (size_t i = 0; i < d.entries.size(); ++i) {
    Entry& en = d.entries[i];
    torch::Tensor scale;
    if (delayed) {
      // The weight's current scale; its amax joins this step's history row as quantizing it would.
      const auto slot = int64_t(e.slot(*en.site, fp8::TensorRole::kWeight));
      scale = e.scale().narrow(0, slot, 1);
      auto recorded = e.history()[0].narrow(0, slot, 1);
      recorded.copy_(torch::maximum(recorded, amax.narrow(0, int64_t(i), 1)));
    } else {
      const auto& current = std::get<fp8::CurrentScaling>(e.recipe());
      scale = scale_from_amax(amax.narrow(0, int64_t(i), 1), fp8::max_finite(format), current.power_2_scales,
                              current.amax_epsilon);
    }
    en.scale_inv = torch::ones_like(scale) / scale;  // 1 / scale in fp32, as the quantizers
    const int64_t lo = std::max(en.offset, offset), hi = std::min(en.offset + en.numel, end);
    if (hi > lo) codes.narrow(0, lo - offset, hi - lo).copy_(cast_to_fp8_codes(parts[i], scale, format));
  }
}

// A gathered range: its weights' codes become their sites' weights for this step, and the model
// parameters take their values.
void Fp8ParamGather::decode(DomainWeights& d, const torch::Tensor& codes, int64_t offset, int64_t numel) {
  torch::NoGradGuard no_grad;
  fp8::Fp8Engine& e = *engine_;
  const fp8::Format format = fp8::tensor_format(e.recipe(), fp8::TensorRole::kWeight);
  for (const Entry& en : d.entries) {
    if (en.offset < offset || en.offset + en.numel > offset + numel) continue;
    fp8::Fp8Site& site = *en.site;
    site.codes = codes.narrow(0, en.offset - offset, en.numel);
    site.codes_scale_inv = en.scale_inv;
    site.codes_generation = e.weight_generation();
    auto& param = site.parameter;
    param.detach().copy_(decode_fp8_codes(site.codes, en.scale_inv, format, param.scalar_type()).view(param.sizes()));
  }
}

}  // namespace fp8tron
