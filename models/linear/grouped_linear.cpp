#include "models/linear/grouped_linear.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/text.h"
#include "fp8/fp8_grouped_linear.h"
#include "fp8/packed_rows.h"
#include "models/linear/modules.h"

namespace fp8tron {

namespace {
// The FP8 engine the experts register with: null when the expert GEMMs stay bf16.
std::shared_ptr<fp8::Fp8Engine> grouped_engine(const GroupedLinearOptions& o, const ModuleFactory& f) {
  return o.use_fp8 ? f.fp8() : nullptr;
}
}  // namespace

TEGroupedLinearImpl::TEGroupedLinearImpl(const GroupedLinearOptions& o, const ModuleFactory& f)
    : options(o), tp(f.tp()), main_grad_fusion(f.main_grads()->fusion()) {
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
    hold_wgrad(true, f, weights.back(), nullptr);  // the grouped node holds all experts' GEMMs at once
  }
  main_grads_ = f.main_grads();
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
}

std::vector<fp8::Fp8Site*> TEGroupedLinearImpl::gemm_sites() const {
  std::vector<fp8::Fp8Site*> sites;
  for (const auto& site : fp8_sites) {
    if (!site) return {};  // the engine keeps this layer's experts in bf16 (all of them: one shape, one layer)
    sites.push_back(site.get());
  }
  return sites;
}

torch::Tensor TEGroupedLinearImpl::forward(const torch::Tensor& x, const std::vector<int64_t>& m_splits,
                                           const torch::Tensor& packed_x) {
  FP8TRON_CHECK(!packed_x.defined() || takes_packed_input(),
                "TEGroupedLinear: rows quantized before they travel need FP8 experts of a per-block recipe");
  return run(x, m_splits, fp8::Prologue::kNone, packed_x);
}

bool TEGroupedLinearImpl::takes_packed_input() const {
  const auto sites = gemm_sites();
  return !sites.empty() && fp8::quantizes_rows_alone(sites[0]->engine->recipe());
}

torch::Tensor TEGroupedLinearImpl::forward_swiglu(const torch::Tensor& h, const std::vector<int64_t>& m_splits) {
  FP8TRON_CHECK(fuses_swiglu(), "TEGroupedLinear: the SwiGLU is fused into FP8 delayed-scaling casts only");
  return run(h, m_splits, fp8::Prologue::kSwiglu);
}

bool TEGroupedLinearImpl::fuses_swiglu() const { return fp8::grouped_linear_fuses_swiglu(gemm_sites()); }

torch::Tensor TEGroupedLinearImpl::run(const torch::Tensor& x, const std::vector<int64_t>& m_splits,
                                       fp8::Prologue prologue, const torch::Tensor& packed_x) {
  const int64_t width = weights.front().size(1) * (prologue == fp8::Prologue::kSwiglu ? 2 : 1);
  FP8TRON_CHECK(x.dim() == 2 && x.size(1) == width, prologue == fp8::Prologue::kSwiglu
                                                        ? "TEGroupedLinear: the input must be [tokens, 2 x local in features]"
                                                        : "TEGroupedLinear: the input must be [tokens, local in features]");
  check_splits(x, m_splits);
  std::vector<torch::Tensor> gemm_biases;
  for (size_t i = 0; i < weights.size(); ++i) gemm_biases.push_back(gemm_bias(i));
  return fp8::grouped_linear(x, m_splits, weights, gemm_biases, gemm_sites(), fp8::Bf16GroupedBackend::kCublasLt,
                             prologue, main_grad_fusion, main_grads_->wgrad_queue_for(weights.front()), packed_x);
}

std::string TEGroupedLinearImpl::describe_plan() const {
  const size_t fp8 = size_t(std::count_if(fp8_sites.begin(), fp8_sites.end(), [](const auto& s) { return s != nullptr; }));
  std::string what = fp8 == 0 ? "bf16 grouped GEMMs (cuBLASLt, bucketed plans)"
                              : fp8 == fp8_sites.size() ? "FP8 grouped GEMMs, one cast for all experts"
                                                        : "FP8 grouped GEMMs (some experts bf16)";
  what += strprintf(" | %lld local experts", (long long)weights.size());
  if (input_dispatched_fp8) what += " | input: the FP8 codes and scales the dispatch delivered (--moe-dispatch-fp8)";
  what += main_grad_fusion ? " | weight gradients: into their fp32 main gradients" : " | weight gradients: to autograd";
  return what;
}

}  // namespace fp8tron
