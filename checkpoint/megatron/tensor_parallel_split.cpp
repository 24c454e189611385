#include "checkpoint/megatron/tensor_parallel_split.h"

#include <regex>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::checkpoint::megatron {

TpSplit tp_split_of(const std::string& full_name, bool gated_linear_unit) {
  static const std::regex kExpert(R"((\.linear_fc[12]\.weight)\d+$)");  // an expert's: split as the dense MLP's
  const std::string name = std::regex_replace(full_name, kExpert, "$1");
  for (const char* s : {".linear_fc1.weight", ".linear_fc1.bias"})
    if (name.ends_with(s)) return gated_linear_unit ? TpSplit::kGatedColumns : TpSplit::kColumns;
  // MLA's up projections (and its query projection without a low rank) split their heads; its
  // down projections are the same on every rank.
  for (const char* s : {".linear_qkv.weight", ".linear_qkv.bias", "word_embeddings.weight", "output_layer.weight",
                        ".linear_q_up_proj.weight", ".linear_kv_up_proj.weight", ".linear_q_proj.weight"})
    if (name.ends_with(s)) return TpSplit::kColumns;
  for (const char* s : {".linear_proj.weight", ".linear_fc2.weight"})
    if (name.ends_with(s)) return TpSplit::kRows;
  return TpSplit::kReplicated;
}

torch::Tensor join_tp_parts(const std::vector<torch::Tensor>& parts, TpSplit split, const std::string& what) {
  switch (split) {
    case TpSplit::kColumns: return torch::cat(parts, 0);
    case TpSplit::kRows: return torch::cat(parts, 1);
    case TpSplit::kGatedColumns: {
      std::vector<torch::Tensor> gates, ups;
      for (const torch::Tensor& p : parts) {
        auto halves = p.chunk(2, 0);
        gates.push_back(halves[0]), ups.push_back(halves[1]);
      }
      gates.insert(gates.end(), ups.begin(), ups.end());
      return torch::cat(gates, 0);
    }
    case TpSplit::kReplicated:
      for (const torch::Tensor& p : parts)
        if (p.sizes() != parts[0].sizes())
          throw UserError("the tensor-parallel ranks hold " + what + " in different shapes; fp8tron does not know how "
                          "Megatron split it");
      return parts[0];
  }
  return parts[0];
}

torch::Tensor tp_part(const torch::Tensor& global, TpSplit split, int64_t rank, int64_t tp, const std::string& what) {
  if (split == TpSplit::kReplicated || tp == 1) return global;
  const int64_t dim = split == TpSplit::kRows ? 1 : 0;
  const int64_t pieces = split == TpSplit::kGatedColumns ? 2 * tp : tp;
  if (global.dim() <= dim || global.size(dim) % pieces != 0)
    throw UserError(strprintf("%s: its dimension %lld does not split over %lld tensor-parallel ranks", what.c_str(),
                              (long long)dim, (long long)tp));
  const int64_t n = global.size(dim) / pieces;
  if (split != TpSplit::kGatedColumns) return global.narrow(dim, rank * n, n);
  const int64_t half = global.size(0) / 2;
  return torch::cat({global.narrow(0, rank * n, n), global.narrow(0, half + rank * n, n)}, 0);
}

}  // namespace fp8tron::checkpoint::megatron
