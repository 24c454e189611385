#include "trainer/cli/context_parallel_args.h"

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {

CpCommType parse_comm_type(const std::string& v) {
  if (v == "p2p") return CpCommType::P2P;
  if (v == "a2a") return CpCommType::A2A;
  // Transformer Engine's name, and the one Megatron's --help prints.
  if (v == "all_gather" || v == "allgather") return CpCommType::AllGather;
  if (v == "a2a+p2p") return CpCommType::A2AP2P;
  throw UserError("--cp-comm-type " + v + ": choose p2p, a2a, all_gather or a2a+p2p");
}

bool uses(const ContextParallelConfig& cp, CpCommType type) {
  for (CpCommType t : cp.comm_types)
    if (t == type) return true;
  return false;
}

}  // namespace

ContextParallelConfig build_context_parallel_config(const FlagValues& f) {
  ContextParallelConfig cp;
  const auto types = f.get_list("cp-comm-type");
  if (!types.empty()) {
    cp.comm_types.clear();
    for (const auto& t : types) cp.comm_types.push_back(parse_comm_type(t));
  }
  for (const auto& s : f.get_list("hierarchical-context-parallel-sizes")) cp.hierarchical_sizes.push_back(std::stoi(s));
  return cp;
}

std::string context_parallel_problem(const Config& c, const FlagValues& f) {
  const ContextParallelConfig& cp = c.context_parallel;
  const int size = c.parallel.cp;
  const ModelConfig& m = c.model;
  if (cp.comm_types.size() != 1 && int64_t(cp.comm_types.size()) != m.num_layers)
    return strprintf("--cp-comm-type takes one type for all layers or one per layer: %zu given for --num-layers %lld",
                     cp.comm_types.size(), (long long)m.num_layers);
  if (!cp.hierarchical_sizes.empty()) {
    int64_t product = 1;
    for (int s : cp.hierarchical_sizes) {
      if (s < 1) return "--hierarchical-context-parallel-sizes must be positive";
      product *= s;
    }
    if (product != size)
      return strprintf("the product of --hierarchical-context-parallel-sizes (%lld) must equal --context-parallel-size (%d)",
                       (long long)product, size);
  }
  if (uses(cp, CpCommType::A2AP2P)) {
    if (cp.hierarchical_sizes.empty())
      return "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in --cp-comm-type";
    if (cp.hierarchical_sizes.size() != 2)
      return "--cp-comm-type a2a+p2p takes two --hierarchical-context-parallel-sizes: the all-to-all level and the ring "
             "level (Transformer Engine's a2a and p2p groups)";
  }
  if (size == 1) return "";
  if (m.seq_length % (2 * size) != 0)
    return strprintf("--seq-length (%lld) must be a multiple of 2 x --context-parallel-size (%d): the load-balanced "
                     "split gives each context-parallel rank two of 2 x %d equal chunks",
                     (long long)m.seq_length, 2 * size, size);
  // Megatron indexes a per-layer list with the MTP layers' numbers 1, 2, ... too.
  if (cp.comm_types.size() > 1 && m.mtp.num_layers > m.num_layers)
    return strprintf("--cp-comm-type with one type per layer: the MTP layers take the types of the first "
                     "--mtp-num-layers (%lld) layers, more than --num-layers (%lld)",
                     (long long)m.mtp.num_layers, (long long)m.num_layers);
  if (!m.transformer_engine_modules)
    return "--context-parallel-size > 1 needs --transformer-impl transformer_engine (Megatron's local attention has no "
           "context parallelism)";
  if (c.data.reset_attention_mask)
    return "--reset-attention-mask cannot be used with --context-parallel-size > 1: context-parallel attention is "
           "causal only (Transformer Engine refuses arbitrary masks with context parallelism)";
  const int64_t heads = m.num_attention_heads / c.parallel.tp;
  if (uses(cp, CpCommType::A2A) && heads % size != 0)
    return strprintf("--cp-comm-type a2a splits the attention heads over the context-parallel ranks: %lld heads per "
                     "tensor-parallel rank are not divisible by --context-parallel-size (%d)",
                     (long long)heads, size);
  if (uses(cp, CpCommType::A2AP2P) && heads % cp.hierarchical_sizes[0] != 0)
    return strprintf("--cp-comm-type a2a+p2p splits the attention heads over the first level of "
                     "--hierarchical-context-parallel-sizes: %lld heads per tensor-parallel rank are not divisible by %d",
                     (long long)heads, cp.hierarchical_sizes[0]);
  (void)f;
  return "";
}

}  // namespace fp8tron
