#include "models/moe/experts.h"

#include <cmath>

#include "core/error.h"
#include "fp8/fp8_linear.h"

namespace fp8tron {
namespace {

// Row index of the padded layout for each row of the unpadded one.
torch::Tensor padded_positions(const std::vector<int64_t>& counts, const std::vector<int64_t>& padded,
                               const torch::Device& device) {
  std::vector<int64_t> positions;
  int64_t base = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    for (int64_t r = 0; r < counts[e]; ++r) positions.push_back(base + r);
    base += padded[e];
  }
  return torch::tensor(positions, torch::kInt64).to(device);
}

}  // namespace

GroupedMlpImpl::GroupedMlpImpl(const ModelConfig& m, const std::string& prefix, int64_t num_local_experts,
                               int64_t expert_offset, const ModuleFactory& f, bool use_fp8)
    : swiglu_(m.swiglu) {
  const int64_t ffn = m.moe.ffn_hidden_size;
  GroupedLinearOptions fc1;
  fc1.in_features = m.hidden_size;
  fc1.out_features = m.swiglu ? 2 * ffn : ffn;
  fc1.num_gemms = num_local_experts;
  fc1.expert_offset = expert_offset;
  fc1.is_expert = true;
  fc1.bias = m.add_bias_linear;
  fc1.init_std = m.init_method_std;
  fc1.init_name = prefix + ".linear_fc1";
  fc1.parallel_mode = GroupedParallelMode::kColumn;
  fc1.interleave = m.swiglu ? 2 : 1;
  fc1.use_fp8 = use_fp8;
  GroupedLinearOptions fc2 = fc1;
  fc2.in_features = ffn;
  fc2.out_features = m.hidden_size;
  fc2.init_std = m.init_method_std / std::sqrt(2.0 * double(m.num_layers));  // Megatron's output_layer_init_method
  fc2.init_name = prefix + ".linear_fc2";
  fc2.parallel_mode = GroupedParallelMode::kRow;
  fc2.interleave = 1;
  linear_fc1 = register_module("linear_fc1", TEGroupedLinear(fc1, f));
  linear_fc2 = register_module("linear_fc2", TEGroupedLinear(fc2, f));
  alignment_ = fp8_alignment();
}

int64_t GroupedMlpImpl::fp8_alignment() const {
  for (const auto* linear : {&linear_fc1, &linear_fc2})
    for (const auto& site : (*linear)->fp8_sites)
      if (site) return fp8::recipe_kind(site->engine->recipe()) == fp8::RecipeKind::kMxfp8 ? 32 : 16;
  return 0;
}

torch::Tensor GroupedMlpImpl::forward(const torch::Tensor& x, const std::vector<int64_t>& counts) {
  std::vector<int64_t> padded = counts;
  bool needs_padding = false;
  if (alignment_ > 0)
    for (auto& c : padded) {
      const int64_t aligned = (c + alignment_ - 1) / alignment_ * alignment_;
      needs_padding = needs_padding || aligned != c;
      c = aligned;
    }
  torch::Tensor input = x, positions;
  if (needs_padding) {
    int64_t rows = 0;
    for (int64_t c : padded) rows += c;
    positions = padded_positions(counts, padded, x.device());
    input = torch::zeros({rows, x.size(1)}, x.options()).index_copy(0, positions, x);
  }
  auto h = linear_fc1(input, padded);
  torch::Tensor a;
  if (swiglu_) {
    // This rank's [gate | up] shards (fc1 splits each half over the expert TP group).
    auto halves = h.chunk(2, -1);
    a = torch::nn::functional::silu(halves[0]) * halves[1];
  } else {
    a = at::gelu(h, "tanh");
  }
  auto y = linear_fc2(a, padded);
  return needs_padding ? y.index_select(0, positions) : y;
}

}  // namespace fp8tron
