// A small Adam of the precision-aware optimizer on the CPU, for the optimizer's tests: four bf16
// (or fp32) parameters of odd sizes, decayed weights and an undecayed bias and norm (two segments),
// each drawn at its own magnitude, under the distributed optimizer of one process or of one rank
// of a data-parallel group of two (whose shard cuts parameters).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optim/mixed_precision_optimizer.h"
#include "parallel/parallel_state.h"
#include "tests/optim/lone_data_parallel_rank.h"

namespace fp8tron {

struct AdamRun {
  std::vector<NamedParam> params;
  std::unique_ptr<MixedPrecisionOptimizer> optimizer;
  OptimizerDomain& domain() const { return *optimizer->domains().front(); }
};

struct AdamRunOptions {
  PrecisionAwareOptimizer aware;
  ParamDtype dtype = ParamDtype::Bf16;
  int dp_rank = -1;  // >= 0: that rank of a data-parallel group of two
  std::vector<double> magnitudes = {0.05, 0.05, 0.05, 0.05};  // of each parameter's values, in order
};

inline AdamRun make_adam_run(const AdamRunOptions& o) {
  static const std::vector<std::pair<std::string, std::vector<int64_t>>> kSpecs = {
      {"embedding.word_embeddings.weight", {37, 16}},
      {"decoder.layers.0.mlp.linear_fc1.weight", {33, 16}},
      {"decoder.layers.0.mlp.linear_fc1.bias", {33}},
      {"decoder.final_layernorm.weight", {16}},
  };
  AdamRun r;
  torch::manual_seed(3);
  const auto dtype = o.dtype == ParamDtype::Bf16 ? torch::kBFloat16 : torch::kFloat32;
  for (size_t i = 0; i < kSpecs.size(); ++i)
    r.params.push_back(
        {kSpecs[i].first, (torch::randn(kSpecs[i].second) * o.magnitudes.at(i)).to(dtype).requires_grad_(true), {}});
  OptimizerConfig oc;
  oc.adam_beta2 = 0.95;
  oc.clip_grad = 0;
  oc.precision_aware = o.aware;
  PrecisionConfig pc;
  pc.params_dtype = o.dtype;
  ParallelState state = single_process_state();
  if (o.dp_rank >= 0) state.dp = std::make_shared<LoneDataParallelRank>(o.dp_rank);
  r.optimizer = std::make_unique<MixedPrecisionOptimizer>(r.params, oc, pc, state, /*distributed=*/true);
  return r;
}

}  // namespace fp8tron
