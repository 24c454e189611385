#include "models/grouped_linear.h"

#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "fp8/fp8_linear.h"
#include "models/modules.h"

namespace fp8tron {
namespace F = torch::nn::functional;

namespace {
// The FP8 engine the experts register with: null when the expert GEMMs stay bf16.
std::shared_ptr<fp8::Fp8Engine> grouped_engine(const GroupedLinearOptions& o, const ModuleFactory& f) {
  if (!f.fp8() || !o.use_fp8) return nullptr;
  if (!fp8::supports_fp8_grouped_gemm(f.fp8()->recipe())) {
    log::warning_once("grouped-gemm-notice", fp8::grouped_gemm_notice(f.fp8()->recipe()));
    return nullptr;
  }
  return f.fp8();
}

// An expert without tokens has no FP8 GEMM, so its wgrad GEMM does not run in this micro-batch.
// When the optimizer leaves the weight's fp32 main gradient to that GEMM (which overwrites it in
// the step's first backward instead of the optimizer zeroing it: Fp8Engine::overwrite_main_grads),
// the expert may get no GEMM in the whole step and would keep the last step's gradient. So the
// first micro-batch of a step that finds the expert idle claims the gradient: zeroes it and marks
// it as this step's (the site's main_grad_generation), so later wgrad GEMMs accumulate onto it.
void claim_idle_main_grad(fp8::Fp8Site& site, const torch::Tensor& weight) {
  const fp8::Fp8Engine& e = *site.engine;
  if (!e.overwrite_main_grads() || !torch::GradMode::is_enabled() || !weight.requires_grad()) return;
  if (site.main_grad_generation == e.weight_generation()) return;  // already this step's
  torch::Tensor grad = weight.grad();
  if (grad.defined()) {
    torch::NoGradGuard no_grad;
    grad.zero_();
  }
  site.main_grad_generation = e.weight_generation();
}
}  // namespace

TEGroupedLinearImpl::TEGroupedLinearImpl(const GroupedLinearOptions& o, const ModuleFactory& f) : options(o), tp(f.tp()) {
  FP8TRON_CHECK(o.num_gemms >= 1, "TEGroupedLinear needs at least one GEMM");
  const bool column = o.parallel_mode == GroupedParallelMode::kColumn;
  FP8TRON_CHECK(column || o.interleave == 1, "interleaved blocks are a column-parallel layout");
  ParamInfo w;
  w.global_shape = {o.out_features, o.in_features};
  w.partition_dim = column ? 0 : 1;
  w.interleave = o.interleave;
  w.expert = o.is_expert;
  ParamInfo b;
  b.global_shape = {o.out_features};
  b.expert = o.is_expert;
  if (column) {
    b.partition_dim = 0;
    b.interleave = o.interleave;
  } else {
    b.reduce_grad_over_tp = tp.size > 1;  // only rank 0 adds it to its partial sums
  }
  const int64_t out = column ? o.out_features / tp.size : o.out_features;
  const int64_t in = column ? o.in_features : o.in_features / tp.size;
  const auto engine = grouped_engine(o, f);
  for (int64_t i = 0; i < o.num_gemms; ++i) {
    const int64_t g = o.expert_offset + i;
    const std::string weight_name = "weight" + std::to_string(g);
    weights.push_back(add_param(weight_name, f.normal(o.init_name + "." + weight_name, w, o.init_std), w));
    if (o.bias) biases.push_back(add_param("bias" + std::to_string(g), f.constant(b, 0.0), b));
    if (engine) {
      const std::string site_name = o.init_name + "." + weight_name;
      auto site = engine->add_site(site_name, layer_number(o.init_name), out, in);
      if (site) site->parameter = weights.back();
      fp8_sites.push_back(std::move(site));  // null: this expert stays bf16 (size, first/last layers)
    }
  }
}

torch::Tensor TEGroupedLinearImpl::gemm_bias(size_t expert) const {
  if (biases.empty()) return {};
  const bool partial_sums = options.parallel_mode == GroupedParallelMode::kRow && tp.size > 1;
  return partial_sums && tp.rank != 0 ? torch::Tensor() : biases[expert];
}

void TEGroupedLinearImpl::check_splits(const torch::Tensor& x, const std::vector<int64_t>& m_splits) const {
  const std::string name = options.init_name.empty() ? "TEGroupedLinear" : "TEGroupedLinear " + options.init_name;
  if (int64_t(m_splits.size()) != options.num_gemms)
    throw UserError(strprintf("%s: m_splits has %zu token counts for %lld experts", name.c_str(), m_splits.size(),
                              (long long)options.num_gemms));
  for (size_t i = 0; i < m_splits.size(); ++i)
    if (m_splits[i] < 0)
      throw UserError(strprintf("%s: expert %zu has a negative token count (%lld)", name.c_str(), i,
                                (long long)m_splits[i]));
  const int64_t total = std::accumulate(m_splits.begin(), m_splits.end(), int64_t{0});
  if (total != x.size(0))
    throw UserError(strprintf("%s: m_splits sum to %lld tokens but the input has %lld", name.c_str(),
                              (long long)total, (long long)x.size(0)));
  for (size_t i = 0; i < fp8_sites.size(); ++i)
    if (fp8_sites[i] && m_splits[i] % 16 != 0)
      throw UserError(strprintf("%s: expert %zu received %lld tokens, not a multiple of 16 as FP8 GEMMs need; pad "
                                "each expert's tokens with --moe-router-padding-for-fp8, or run the expert GEMMs in "
                                "bf16 with --no-use-gmm-fp8",
                                name.c_str(), i, (long long)m_splits[i]));
}

torch::Tensor TEGroupedLinearImpl::forward(const torch::Tensor& x, const std::vector<int64_t>& m_splits) {
  FP8TRON_CHECK(x.dim() == 2 && x.size(1) == weights.front().size(1),
                "TEGroupedLinear: the input must be [tokens, local in features]");
  check_splits(x, m_splits);
  std::vector<torch::Tensor> outputs;
  outputs.reserve(weights.size());
  int64_t row = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const torch::Tensor slice = x.narrow(0, row, m_splits[i]);
    row += m_splits[i];
    const std::shared_ptr<fp8::Fp8Site> site = fp8_sites.empty() ? nullptr : fp8_sites[i];
    if (site && m_splits[i] > 0) {
      outputs.push_back(fp8::fp8_linear(slice, weights[i], gemm_bias(i), *site));
      continue;
    }
    // bf16, or an expert without tokens: the empty product still gives its weight and bias a
    // (zero) gradient, keeping the graph independent of the routing.
    if (site) claim_idle_main_grad(*site, weights[i]);
    outputs.push_back(F::linear(slice, weights[i], gemm_bias(i)));
  }
  return outputs.size() == 1 ? outputs.front() : torch::cat(outputs, 0);
}

}  // namespace fp8tron
