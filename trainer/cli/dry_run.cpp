#include "trainer/cli/dry_run.h"

#include <sstream>

#include "core/text.h"
#include "trainer/cli/model_math.h"

namespace fp8tron {

std::string format_arguments(const Config& c) {
  std::ostringstream os;
  os << "------------------------ arguments ------------------------\n";
  for (const auto& [name, value] : c.resolved_flags) {
    std::string key = name;
    for (auto& ch : key) if (ch == '-') ch = '_';
    const size_t dots = key.size() < 48 ? 48 - key.size() : 1;
    os << "  " << key << " " << std::string(dots, '.') << " " << value << "\n";
  }
  os << "-------------------- end of arguments ---------------------";
  return os.str();
}

namespace {
// The MoE layout: which layers, the experts and where they live, routing, dispatch.
std::string format_moe_plan(const Config& c, const ParameterCount& p) {
  const MoeConfig& e = c.model.moe;
  const ParallelSizes& z = c.parallel;
  std::string layers;
  for (size_t i = 0; i < e.layer_pattern.size(); ++i) layers += e.layer_pattern[i] ? '1' : '0';
  const char* score = e.score_function == MoeScoreFunction::kSoftmax ? (e.pre_softmax ? "softmax (pre-top-k)" : "softmax")
                      : e.score_function == MoeScoreFunction::kSigmoid ? "sigmoid"
                                                                       : "sqrtsoftplus";
  std::string balancing;
  for (const auto& t : e.balancing) balancing += strprintf("%s%s %g", balancing.empty() ? "" : ", ", moe_balancing_name(t.type), t.coeff);
  std::string out = strprintf("mixture of experts: %lld MoE layers of %lld (pattern %s), %lld experts of ffn %lld, top-%lld %s "
                              "routing%s%s, balancing %s%s\n",
                              (long long)p.moe_layers, (long long)c.model.num_layers, layers.c_str(), (long long)e.num_experts,
                              (long long)e.ffn_hidden_size, (long long)e.topk, score,
                              e.group_topk ? strprintf(" (%lld of %lld groups)", (long long)*e.group_topk, (long long)*e.num_groups).c_str() : "",
                              e.enable_expert_bias ? " with expert bias" : "", balancing.c_str(),
                              e.z_loss_coeff ? strprintf(", z-loss %g", *e.z_loss_coeff).c_str() : "");
  if (c.model.mtp.num_layers > 0)
    out += strprintf("  multi-token prediction: %lld %s layer(s) after the decoder's\n", (long long)c.model.mtp.num_layers,
                     mtp_layers_are_moe(c.model, !c.model.mtp.chunk_without_decoder_layers) ? "MoE" : "dense");
  if (e.shared_expert_size > 0)
    out += strprintf("  shared expert: ffn %lld%s%s\n", (long long)e.shared_expert_size, e.shared_expert_gate ? ", gated" : "",
                     e.shared_expert_overlap ? ", overlapped with the dispatch" : "");
  if (e.capacity_factor)
    out += strprintf("  capacity factor %g (drop by %s%s)\n", *e.capacity_factor,
                     e.drop_policy == MoeDropPolicy::kProbs ? "probs" : "position", e.pad_to_capacity ? ", padded to capacity" : "");
  out += strprintf("  experts: %lld per expert-parallel rank (EP %d), expert tensor parallel %d, expert data parallel %d; "
                   "%s dispatcher\n",
                   (long long)(e.num_experts / z.ep), z.ep, z.etp, z.edp,
                   e.dispatcher == MoeDispatcher::kAllToAll ? "alltoall" : "allgather");
  out += strprintf("  parameters: %lld total, %lld active per token (%s / %s)\n", (long long)p.total, (long long)p.active,
                   human_count(double(p.total)).c_str(), human_count(double(p.active)).c_str());
  return out;
}
}  // namespace

std::string format_plan(const Config& c) {
  std::ostringstream os;
  const ParameterCount p = count_parameters(c.model);
  const double flops = training_flops_per_token(c.model);
  const MemoryEstimate mem = estimate_memory(c);
  const ModelConfig& m = c.model;
  os << "launcher: " << c.launch.launcher << ", device: " << c.device << "\n";
  os << "parallel layout: " << c.parallel.describe() << "\n";
  os << strprintf("model: %lld layers, hidden %lld, ffn %lld, %lld heads (%lld query groups, %lld channels), seq %lld, "
                  "vocab %lld padded to %lld\n",
                  (long long)m.num_layers, (long long)m.hidden_size, (long long)m.ffn_hidden_size,
                  (long long)m.num_attention_heads, (long long)m.num_query_groups, (long long)m.kv_channels,
                  (long long)m.seq_length, (long long)m.vocab_size, (long long)m.padded_vocab_size);
  os << strprintf("parameters: %lld (%s): embedding %lld, per layer %lld, output layer %lld\n", (long long)p.total,
                  human_count(double(p.total)).c_str(), (long long)p.embedding, (long long)p.per_layer,
                  (long long)p.output_layer);
  if (m.moe.enabled()) os << format_moe_plan(c, p);
  os << strprintf("training FLOPs per token: %.4g (%.3f GFLOP%s)\n", flops, flops / 1e9,
                  m.moe.enabled() ? ", active parameters" : "");
  os << strprintf("batch: micro %lld x data-parallel %d x %lld micro-batches = global %lld sequences (%lld tokens), "
                  "%lld iterations\n",
                  (long long)c.training.micro_batch_size, c.parallel.dp, (long long)c.training.num_micro_batches,
                  (long long)c.training.global_batch_size, (long long)(c.training.global_batch_size * m.seq_length),
                  (long long)c.training.train_iters);
  os << "memory estimate per GPU (first pipeline stage):\n";
  const bool sharded = mem.gathered_weights > 0;  // optim_grads_params over more than one rank
  os << "  weights            " << human_bytes(mem.weights)
     << (sharded ? " (this rank's shard)" : mem.sharded_grads ? " (whole, and this rank's shard they are gathered from)" : "")
     << "\n";
  if (sharded)
    os << "  gathered weights   " << human_bytes(mem.gathered_weights)
       << " (optim_grads_params: the largest unit gathered around its use" << (c.distributed.overlap_param_gather ? ", and the next one prefetched)" : ")")
       << "\n";
  os << "  fp32 main weights  " << human_bytes(mem.main_weights) << "\n";
  os << "  gradients          " << human_bytes(mem.grads)
     << (mem.sharded_grads ? " (the units accumulating or being reduced, about three at once)" : "") << "\n";
  if (mem.grad_shard > 0)
    os << "  fp32 grad shard    " << human_bytes(mem.grad_shard) << " (the reduced gradients the optimizer steps on)\n";
  os << "  optimizer states   " << human_bytes(mem.optimizer_states) << "\n";
  os << "  activations        " << human_bytes(mem.activations_fused) << " with fused attention ("
     << human_bytes(mem.activations_paper) << " by the paper's formula, attention scores stored)\n";
  os << "  logits + loss      " << human_bytes(mem.logits) << "\n";
  os << "  total              " << human_bytes(mem.total()) << "\n";
  os << "  start-up           " << human_bytes(mem.startup)
     << " (the weights as drawn in fp32 beside the weight and main-weight buffers)\n";
  os << "  expected peak      " << human_bytes(mem.peak()) << "\n";
  if (c.distributed.tp_overlap.enabled()) os << c.distributed.tp_overlap.describe() << "\n";
  if (!c.not_supported_yet.empty()) {
    os << "not supported yet (training refuses to start with these; the figures above ignore them):\n";
    for (const auto& f : c.not_supported_yet) os << "  " << f << "\n";
  }
  return os.str();
}

}  // namespace fp8tron
