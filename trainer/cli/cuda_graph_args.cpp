#include "trainer/cli/cuda_graph_args.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace fp8tron {
namespace {

const char* kFlag = "--cuda-graph-impl full_iteration";

// Megatron's graph scopes (--cuda-graph-scope / --cuda-graph-modules); "full" is the older
// spelling of a whole layer.
const std::set<std::string>& megatron_scopes() {
  static const std::set<std::string> names = {"attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full",
                                              "full_iteration"};
  return names;
}

}  // namespace

CudaGraphConfig build_cuda_graph_config(const FlagValues& f, std::vector<std::string>& warnings) {
  std::vector<std::string> scopes = f.get_list("cuda-graph-scope");
  for (const auto& m : f.get_list("cuda-graph-modules")) scopes.push_back(m);
  for (const auto& s : scopes)
    if (!megatron_scopes().count(s))
      throw UserError("--cuda-graph-scope " + s +
                      ": not a graph scope (choose from attn, mlp, moe, moe_router, moe_preprocess, mamba, full_iteration)");
  const bool full_scope = std::find(scopes.begin(), scopes.end(), "full_iteration") != scopes.end();
  const std::string impl = f.get_string("cuda-graph-impl");
  const bool per_layer_impl = impl == "local" || impl == "transformer_engine" || f.get_bool("enable-cuda-graph");
  CudaGraphConfig g;
  g.full_iteration = impl == "full_iteration" || (per_layer_impl && impl != "transformer_engine" && full_scope);
  g.warmup_steps = f.get_int("cuda-graph-warmup-steps");
  if (g.full_iteration && g.warmup_steps < 1)
    throw UserError("--cuda-graph-warmup-steps must be at least 1 with " + std::string(kFlag) +
                    " (the eager steps create the library handles and workspaces the graph replays)");
  if (!g.full_iteration && full_scope && !per_layer_impl)
    warnings.push_back("--cuda-graph-scope full_iteration without --cuda-graph-impl captures nothing (as in Megatron): "
                       "add " + std::string(kFlag) + " to capture each step's forward and backward passes");
  else if (!g.full_iteration && (per_layer_impl || !scopes.empty()))
    warnings.push_back("per-layer CUDA graphs (--cuda-graph-impl local/transformer_engine, --enable-cuda-graph, "
                       "--cuda-graph-scope) are not implemented in fp8tron: every step runs eagerly; " +
                       std::string(kFlag) + " captures each step's forward and backward passes as one graph");
  return g;
}

std::string cuda_graph_problem(const Config& c, const FlagValues&) {
  if (!c.training.cuda_graph.full_iteration) return "";
  const std::string run_without = "; run without " + std::string(kFlag);
  if (c.device != "cuda") return std::string(kFlag) + " needs a GPU (CUDA graphs)" + run_without;
  const ParallelSizes& p = c.parallel;
  if (p.world_size > 1)
    return std::string(kFlag) + " captures one GPU's step so far: the collectives of " + p.describe() +
           " are not captured" + run_without;
  if (c.model.moe.enabled())
    return std::string(kFlag) + " cannot capture a mixture-of-experts step: its token counts go to the host" +
           run_without;
  if (c.model.mtp.num_layers > 0)
    return std::string(kFlag) + " does not capture multi-token prediction (--mtp-num-layers) yet" + run_without;
  if (c.precision.fp8.param_gather)
    return std::string(kFlag) + " does not capture --fp8-param-gather's FP8 weights yet" + run_without;
  if (c.precision.dynamic_loss_scale())
    return std::string(kFlag) + " needs a fixed loss scale: --fp16's dynamic scale changes between steps (use --bf16, "
           "or --loss-scale)" + run_without;
  if (c.model.recompute.granularity != RecomputeGranularity::None)
    return std::string(kFlag) + " does not capture activation recomputation (--recompute-granularity) yet" +
           run_without;
  if (c.training.numerics.test_nan_iteration > 0)
    return std::string(kFlag) + " replays the same step: --fp8tron-test-inject-nan cannot pick an iteration" +
           run_without;
  return "";
}

}  // namespace fp8tron
