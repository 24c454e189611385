#include "core/config/parallel_config.h"

#include <utility>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {

ParallelSizes ParallelSizes::derive(int world_size, int tp, int cp, int pp, int ep, int etp, bool tp_pp_dp_order) {
  ParallelSizes s;
  s.world_size = world_size;
  s.tp = tp; s.cp = cp; s.pp = pp; s.ep = ep; s.etp = etp;
  s.tp_pp_dp_order = tp_pp_dp_order;
  for (auto [v, flag] : {std::pair{tp, "--tensor-model-parallel-size"}, {cp, "--context-parallel-size"},
                         {pp, "--pipeline-model-parallel-size"}, {ep, "--expert-model-parallel-size"},
                         {etp, "--expert-tensor-parallel-size"}})
    if (v < 1) throw UserError(std::string(flag) + " must be at least 1");
  const int model = tp * cp * pp;
  if (world_size % model != 0)
    throw UserError(strprintf("world size %d is not divisible by --tensor-model-parallel-size (%d) x "
                              "--context-parallel-size (%d) x --pipeline-model-parallel-size (%d) = %d",
                              world_size, tp, cp, pp, model));
  s.dp = world_size / model;
  const int expert_model = etp * ep * pp;
  if (world_size % expert_model != 0)
    throw UserError(strprintf("world size %d is not divisible by --expert-tensor-parallel-size (%d) x "
                              "--expert-model-parallel-size (%d) x --pipeline-model-parallel-size (%d)",
                              world_size, etp, ep, pp));
  s.edp = world_size / expert_model;
  return s;
}

std::string ParallelSizes::order() const { return tp_pp_dp_order ? "tp-cp-ep-pp-dp" : "tp-cp-ep-dp-pp"; }

std::string ParallelSizes::describe() const {
  return strprintf("world %d = TP %d x CP %d x DP %d x PP %d (order %s) | experts: ETP %d x EP %d x EDP %d x PP %d",
                   world_size, tp, cp, dp, pp, order().c_str(), etp, ep, edp, pp);
}

const char* tp_gemm_name(TpGemm g) {
  static const char* const names[kNumTpGemms] = {"qkv_fprop", "qkv_dgrad", "qkv_wgrad", "proj_fprop",
                                                 "proj_dgrad", "proj_wgrad", "fc1_fprop", "fc1_dgrad",
                                                 "fc1_wgrad", "fc2_fprop", "fc2_dgrad", "fc2_wgrad"};
  return names[size_t(g)];
}

const char* overlap_method_name(OverlapMethod m) {
  switch (m) {
    case OverlapMethod::kOff: return "off";
    case OverlapMethod::kRingExchange: return "ring_exchange";
    case OverlapMethod::kPipeline: return "pipeline";
    case OverlapMethod::kBulk: return "bulk";
    case OverlapMethod::kExternal: return "external";
  }
  return "?";
}

std::string TpOverlapConfig::describe() const {
  const char* by = source == TpOverlapSource::kMc2   ? "--use-ascend-mc2"
                   : source == TpOverlapSource::kCoc ? "--use-ascend-coc"
                                                     : "--tp-comm-overlap";
  std::string s = std::string("tensor-parallel communication overlap (") + by + "):";
  for (size_t i = 0; i < kNumTpGemms; ++i) {
    const GemmOverlap& g = gemms[i];
    s += std::string(i == 0 ? " " : ", ") + tp_gemm_name(TpGemm(i)) + " " + overlap_method_name(g.method);
    if (g.method == OverlapMethod::kPipeline) s += strprintf("/%d", g.num_splits);
    if (g.aggregate) s += "+aggregate";
    if (g.fp8_wire && g.method != OverlapMethod::kOff) s += "+fp8";
  }
  if (output_layer) s += ", output_layer ring_exchange";
  return s;
}

}  // namespace fp8tron
