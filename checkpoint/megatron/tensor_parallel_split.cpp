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

namespace {

// A run of a joined tensor along its split dimension: elements [begin, begin + length) of the
// global tensor are [part_begin, part_begin + length) of part `part`.
struct Run {
  int64_t begin, length;
  size_t part;
  int64_t part_begin;
};

}  // namespace

StoredTensor join_tp_parts(const std::vector<StoredTensor>& parts, TpSplit split, const std::string& what) {
  FP8TRON_CHECK(!parts.empty(), "tensor-parallel parts to join");
  const std::vector<int64_t>& first = parts[0].shape();
  const size_t dim = split == TpSplit::kRows ? 1 : 0;
  const int64_t halves = split == TpSplit::kGatedColumns ? 2 : 1;
  for (const StoredTensor& p : parts) {
    bool joins = p.dtype() == parts[0].dtype() && p.shape().size() == first.size();
    for (size_t d = 0; joins && d < first.size(); ++d)
      joins = p.shape()[d] == first[d] || (split != TpSplit::kReplicated && d == dim);
    if (split != TpSplit::kReplicated) joins = joins && first.size() > dim && p.shape()[dim] % halves == 0;
    if (!joins)
      throw UserError("the tensor-parallel ranks hold " + what + " in shapes that do not join (" + shape_text(first) +
                      " and " + shape_text(p.shape()) + "); fp8tron does not know how Megatron split it");
  }
  if (split == TpSplit::kReplicated || parts.size() == 1) return parts[0];
  std::vector<Run> runs;
  int64_t length = 0;
  for (int64_t h = 0; h < halves; ++h)  // a gated unit's gate halves of every rank, then their up halves
    for (size_t p = 0; p < parts.size(); ++p) {
      const int64_t n = parts[p].shape()[dim] / halves;
      runs.push_back(Run{length, n, p, h * n});
      length += n;
    }
  std::vector<int64_t> shape = first;
  shape[dim] = length;
  const torch::ScalarType dtype = parts[0].dtype();
  return StoredTensor(shape, dtype, parts[0].source(),
                      [parts, runs, dim, dtype](const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes) {
                        const int64_t lo = offsets[dim], hi = lo + sizes[dim];
                        std::vector<torch::Tensor> pieces;
                        for (const Run& run : runs) {
                          const int64_t b = std::max(lo, run.begin), e = std::min(hi, run.begin + run.length);
                          if (b >= e) continue;
                          std::vector<int64_t> at = offsets, extent = sizes;
                          at[dim] = run.part_begin + b - run.begin, extent[dim] = e - b;
                          pieces.push_back(parts[run.part].read(at, extent));
                        }
                        if (pieces.empty()) return torch::empty(sizes, torch::TensorOptions().dtype(dtype));
                        return pieces.size() == 1 ? pieces[0] : torch::cat(pieces, int64_t(dim));
                      });
}

torch::Tensor join_tp_parts(const std::vector<torch::Tensor>& parts, TpSplit split, const std::string& what) {
  return join_tp_parts(std::vector<StoredTensor>(parts.begin(), parts.end()), split, what).read();
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
