#include "trainer/cli/sharded_dp_args.h"

#include "core/error.h"

namespace fp8tron {
namespace {

using S = DataParallelSharding;

const char* dtype_name(ParamDtype d) { return d == ParamDtype::Bf16 ? "bf16" : d == ParamDtype::Fp16 ? "fp16" : "fp32"; }

// The gradient buffer's dtype: fp32 unless the gradients accumulate in the parameters' dtype.
std::string main_grads_dtype(const PrecisionConfig& p) { return p.grads_in_fp32 ? "fp32" : dtype_name(p.params_dtype); }

// --megatron-fsdp-main-params-dtype, -main-grads-dtype and -grad-comm-dtype: fp8tron keeps fp32
// main weights, accumulates gradients in its gradient buffer's dtype and reduces them in it.
std::string precision_problem(const Config& c, const FlagValues& f) {
  const std::string params = f.get_string("megatron-fsdp-main-params-dtype");
  if (params != "fp32" && !(params == "auto" && c.precision.params_dtype == ParamDtype::Fp32))
    return "--megatron-fsdp-main-params-dtype " + params +
           " is not supported yet: fp8tron keeps fp32 main weights (use --megatron-fsdp-main-params-dtype fp32)";
  const std::string grads = main_grads_dtype(c.precision);
  const std::string main_grads = f.get_string("megatron-fsdp-main-grads-dtype");
  if (main_grads != "auto" && main_grads != grads)
    return "--megatron-fsdp-main-grads-dtype " + main_grads + " differs from the gradient buffer's dtype (" + grads +
           (grads == "fp32" ? "): use fp32 or auto" : "): use " + grads + " or auto, or add --accumulate-allreduce-grads-in-fp32");
  const std::string comm = f.get_string("megatron-fsdp-grad-comm-dtype");
  if (comm != "auto" && comm != grads)
    return "--megatron-fsdp-grad-comm-dtype " + comm + " is not supported yet: fp8tron reduces gradients in their buffer's dtype (" +
           grads + "): use " + grads + " or auto";
  return "";
}

// Megatron's rules for --use-torch-fsdp2 (arguments.py), which fp8tron runs as optim_grads_params.
std::string torch_fsdp2_problem(const Config& c, const FlagValues& f) {
  if (f.get_bool("use-megatron-fsdp")) return "--use-torch-fsdp2 and --use-megatron-fsdp are two engines: pick one";
  if (c.parallel.pp > 1) return "--use-torch-fsdp2 is not supported with pipeline parallelism (Megatron's rule)";
  if (c.parallel.ep > 1) return "--use-torch-fsdp2 is not supported with expert parallelism (Megatron's rule): use --use-megatron-fsdp";
  if (f.get_bool("use-distributed-optimizer"))
    return "--use-torch-fsdp2 is not supported with MCore's distributed optimizer (Megatron's rule): drop --use-distributed-optimizer";
  if (c.precision.gradient_accumulation_fusion)
    return "--use-torch-fsdp2 is not supported with gradient accumulation fusion (Megatron's rule): add --no-gradient-accumulation-fusion";
  if (!c.model.untie_embeddings_and_output_weights)
    return "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights (Megatron's rule)";
  if (c.precision.params_dtype == ParamDtype::Fp16) return "--use-torch-fsdp2 not supported with fp16 yet (Megatron's rule): use --bf16";
  return "";
}

// What the ZeRO-3 engine (parameters gathered around each part's forward and backward) does not
// compose with yet.
std::string sharded_params_problem(const Config& c) {
  const std::string me = "--data-parallel-sharding-strategy optim_grads_params";
  if (c.training.cuda_graph.full_iteration)
    return me + " with --cuda-graph-impl full_iteration is not supported yet: use optim_grads";
  if (c.training.weight_hash_interval)
    return "--check-weight-hash-across-dp-replicas-interval is not supported with optim_grads_params (Megatron's rule)";
  return "";
}

}  // namespace

DataParallelSharding build_data_parallel_sharding(const FlagValues& f) {
  if (f.get_bool("use-torch-fsdp2")) return S::OptimGradsParams;
  if (!f.get_bool("use-megatron-fsdp")) return S::None;
  const std::string s = f.get_string("data-parallel-sharding-strategy");
  if (s == "no_shard") return S::NoShard;
  if (s == "optim") return S::Optim;
  if (s == "optim_grads") return S::OptimGrads;
  if (s == "optim_grads_params") return S::OptimGradsParams;
  throw UserError("--data-parallel-sharding-strategy must be no_shard, optim, optim_grads or optim_grads_params, not " + s);
}

const char* data_parallel_sharding_name(DataParallelSharding s) {
  switch (s) {
    case S::None: return "none";
    case S::NoShard: return "no_shard";
    case S::Optim: return "optim";
    case S::OptimGrads: return "optim_grads";
    case S::OptimGradsParams: return "optim_grads_params";
  }
  return "";
}

std::string sharded_data_parallel_problem(const Config& c, const FlagValues& f) {
  const DataParallelSharding s = c.distributed.dp_sharding;
  const bool fsdp_flags = f.given("data-parallel-sharding-strategy") || f.given("megatron-fsdp-main-params-dtype") ||
                          f.given("megatron-fsdp-main-grads-dtype") || f.given("megatron-fsdp-grad-comm-dtype") ||
                          f.given("outer-dp-sharding-strategy");
  if (f.get_bool("torch-fsdp2-no-reshard-after-forward") && !f.get_bool("use-torch-fsdp2"))
    return "--torch-fsdp2-no-reshard-after-forward needs --use-torch-fsdp2";
  if (s == S::None)
    return fsdp_flags ? "--data-parallel-sharding-strategy and the --megatron-fsdp-* / --outer-dp-sharding-strategy flags need "
                        "--use-megatron-fsdp"
                      : "";
  if (f.get_bool("use-torch-fsdp2")) {
    if (std::string p = torch_fsdp2_problem(c, f); !p.empty()) return p;
  }
  if (c.optimizer.optimizer != "adam" && c.optimizer.optimizer != "sgd")
    return "Megatron-FSDP does not support the " + c.optimizer.optimizer + " optimizer (Megatron's rule): use adam or sgd";
  if (std::string p = precision_problem(c, f); !p.empty()) return p;
  if (f.get_string("outer-dp-sharding-strategy") != "no_shard")
    return "--outer-dp-sharding-strategy " + f.get_string("outer-dp-sharding-strategy") +
           " is not supported yet: fp8tron's optimizer instances replicate across the outer group (use no_shard)";
  const int instances = c.distributed.optimizer_instances;
  if (instances > 1 && (s == S::NoShard || s == S::Optim))
    return std::string("--num-distributed-optimizer-instances > 1 with --data-parallel-sharding-strategy ") +
           data_parallel_sharding_name(s) + " is not supported: use optim_grads or optim_grads_params";
  if (s == S::NoShard && c.distributed.overlap_param_gather)
    return "--overlap-param-gather with --data-parallel-sharding-strategy no_shard has nothing to gather: drop it";
  if ((s == S::OptimGrads || s == S::OptimGradsParams) && c.distributed.overlap_param_gather_with_optimizer_step)
    return std::string("--overlap-param-gather-with-optimizer-step with --data-parallel-sharding-strategy ") +
           data_parallel_sharding_name(s) + " is not supported: each unit's weights are gathered at their first use "
           "(drop the flag, or use optim)";
  if (s == S::OptimGradsParams) return sharded_params_problem(c);
  return "";
}

}  // namespace fp8tron
