#include "optim/muon.h"

#include <map>
#include <tuple>

#include "core/error.h"

namespace fp8tron {
namespace {

using Coefficients = std::vector<std::tuple<double, double, double>>;

// Emerging-Optimizers' _COEFFICIENT_SETS; "cycle" restarts the list, "repeat_last" keeps its end.
const Coefficients& coefficient_set(const std::string& name, bool* repeat_last) {
  static const std::map<std::string, Coefficients> sets = {
      {"simple", {{3.4445, -4.7750, 2.0315}}},
      {"quintic",
       {{4.0848, -6.8946, 2.9270}, {3.9505, -6.3029, 2.6377}, {3.7418, -5.5913, 2.3037}, {2.8769, -3.1427, 1.2046},
        {2.8366, -3.0525, 1.2012}}},
      {"polar_express",
       {{8.2051, -22.9019, 16.4607}, {4.0664, -2.8612, 0.5184}, {3.9096, -2.8234, 0.5250}, {3.2856, -2.4153, 0.4853},
        {2.2779, -1.6198, 0.3985}, {1.8726, -1.2307, 0.3585}, {1.8564, -1.2132, 0.3568}, {1.8750, -1.2500, 0.3750}}},
      {"cans",
       {{8.4703, -25.1081, 18.6293}, {4.1828, -3.1087, 0.5806}, {3.9619, -2.9541, 0.5630}, {3.2866, -2.4647, 0.5074},
        {2.2737, -1.6447, 0.4162}}},
      {"aol", {{4.0098, -7.0585, 2.4635}, {3.4585, -5.5479, 2.5959}, {2.7573, -3.2939, 1.4254}, {2.7215, -3.0494, 1.3169}}},
  };
  auto it = sets.find(name);
  FP8TRON_CHECK(it != sets.end(), "unknown Newton-Schulz coefficient set " + name);
  *repeat_last = name == "polar_express" || name == "cans";
  return it->second;
}

// Gathers this rank's shard with the other tensor-parallel ranks' along `dim` (in rank order).
torch::Tensor gather_shards(const torch::Tensor& shard, int64_t dim, Communicator& tp) {
  auto moved = shard.transpose(0, dim).contiguous();
  auto sizes = moved.sizes().vec();
  sizes[0] *= tp.size();
  auto all = torch::empty(sizes, moved.options());
  tp.all_gather(all, moved);
  return all.transpose(0, dim).contiguous();
}

// Orthogonalise one matrix (a whole shard, or a Q/K/V part of it) and scale it by its global shape.
torch::Tensor orthogonalize(const torch::Tensor& g, int partition_dim, const MuonConfig& c, Communicator& tp) {
  const bool gather = partition_dim >= 0 && tp.size() > 1 && c.tp_mode != "blockwise";
  auto full = gather ? gather_shards(g, partition_dim, tp) : g;
  auto o = newton_schulz(full, c.num_ns_steps, c.coefficient_type, c.matmul_precision == "medium");
  if (gather) o = o.chunk(tp.size(), partition_dim)[size_t(tp.rank())].contiguous();
  return o * (muon_scale_factor(full.size(0), full.size(1), c.scale_mode) * c.extra_scale_factor);
}

}  // namespace

torch::Tensor newton_schulz(const torch::Tensor& x, int64_t steps, const std::string& coefficients, bool bf16) {
  FP8TRON_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "newton_schulz takes a 2-D fp32 matrix");
  const bool transpose = x.size(0) > x.size(1);
  auto X = transpose ? x.t() : x;
  X = X / X.norm().clamp_min(1e-15);  // F.normalize(p=2, dim=(-2, -1), eps=1e-15)
  if (bf16) X = X.to(torch::kBFloat16);
  bool repeat_last = false;
  const Coefficients& set = coefficient_set(coefficients, &repeat_last);
  for (int64_t i = 0; i < steps; ++i) {
    const auto& [a, b, cc] = set[repeat_last ? std::min<size_t>(size_t(i), set.size() - 1) : size_t(i) % set.size()];
    auto A = X.matmul(X.t());
    if (cc != 0.0) {
      auto B = torch::addmm(A, A, A, /*beta=*/b, /*alpha=*/cc);
      X = torch::addmm(X, B, X, /*beta=*/a, /*alpha=*/1.0);
    } else {
      X = torch::addmm(X, A, X, /*beta=*/a, /*alpha=*/b);
    }
  }
  X = X.to(torch::kFloat32);
  return transpose ? X.t().contiguous() : X;
}

double muon_scale_factor(int64_t out, int64_t in, const std::string& mode) {
  if (mode == "shape_scaling") return std::sqrt(std::max(1.0, double(out) / double(in)));
  if (mode == "spectral") return std::sqrt(double(std::max(out, in)));
  if (mode == "unit_rms_norm") return std::sqrt(double(out) / double(in));
  FP8TRON_CHECK(false, "unknown Muon scale mode " + mode);
}

torch::Tensor muon_update(const torch::Tensor& u, const MuonParam& p, const MuonConfig& c, Communicator& tp) {
  const int dim = p.info.partition_dim;
  if (!(p.qkv && c.split_qkv)) return orthogonalize(u, dim, c, tp);
  // Megatron's split: per query group the rows are [Q heads | K | V]; each part, re-flattened in
  // group order, is orthogonalised on its own and put back in place.
  int64_t per_group = 0;
  for (int64_t r : p.qkv_rows) per_group += r;
  const int64_t groups = u.size(0) / per_group, in = u.size(1);
  auto parts = u.view({groups, per_group, in}).split_with_sizes(p.qkv_rows, 1);
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < parts.size(); ++i)
    out.push_back(orthogonalize(parts[i].reshape({-1, in}), dim, c, tp).view({groups, p.qkv_rows[i], in}));
  return torch::cat(out, 1).view(u.sizes());
}

}  // namespace fp8tron
