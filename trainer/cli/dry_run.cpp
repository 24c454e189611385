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
  os << strprintf("training FLOPs per token: %.4g (%.3f GFLOP)\n", flops, flops / 1e9);
  os << strprintf("batch: micro %lld x data-parallel %d x %lld micro-batches = global %lld sequences (%lld tokens), "
                  "%lld iterations\n",
                  (long long)c.training.micro_batch_size, c.parallel.dp, (long long)c.training.num_micro_batches,
                  (long long)c.training.global_batch_size, (long long)(c.training.global_batch_size * m.seq_length),
                  (long long)c.training.train_iters);
  os << "memory estimate per GPU (first pipeline stage):\n";
  os << "  weights            " << human_bytes(mem.weights) << "\n";
  os << "  fp32 main weights  " << human_bytes(mem.main_weights) << "\n";
  os << "  gradients          " << human_bytes(mem.grads) << "\n";
  os << "  optimizer states   " << human_bytes(mem.optimizer_states) << "\n";
  os << "  activations        " << human_bytes(mem.activations_fused) << " with fused attention ("
     << human_bytes(mem.activations_paper) << " by the paper's formula, attention scores stored)\n";
  os << "  logits + loss      " << human_bytes(mem.logits) << "\n";
  os << "  total              " << human_bytes(mem.total()) << "\n";
  if (c.distributed.tp_overlap.enabled()) os << c.distributed.tp_overlap.describe() << "\n";
  if (!c.not_supported_yet.empty()) {
    os << "not supported yet (training refuses to start with these; the figures above ignore them):\n";
    for (const auto& f : c.not_supported_yet) os << "  " << f << "\n";
  }
  return os.str();
}

}  // namespace fp8tron
