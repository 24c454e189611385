#include "checkpoint/saved_tensors.h"

#include "checkpoint/training_state.h"
#include "core/error.h"
#include "core/text.h"
#include "fp8/fp8_engine.h"

namespace fp8tron {
namespace ck = checkpoint;

ck::DType checkpoint_dtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return ck::DType::F32;
    case torch::kBFloat16: return ck::DType::BF16;
    case torch::kFloat16: return ck::DType::F16;
    case torch::kFloat64: return ck::DType::F64;
    default: break;
  }
  FP8TRON_CHECK(false, std::string("no checkpoint dtype for ") + c10::toString(t));
}

torch::ScalarType torch_dtype(ck::DType d, const std::string& tensor) {
  switch (d) {
    case ck::DType::F32: return torch::kFloat32;
    case ck::DType::BF16: return torch::kBFloat16;
    case ck::DType::F16: return torch::kFloat16;
    case ck::DType::F64: return torch::kFloat64;
    default: break;
  }
  throw UserError(strprintf("checkpoint tensor '%s' is %s; model weights and optimizer states must be F32, BF16, F16 "
                            "or F64", tensor.c_str(), ck::dtype_name(d)));
}

namespace {
constexpr const char* kExpAvg = "optimizer.state.exp_avg.";
constexpr const char* kExpAvgSq = "optimizer.state.exp_avg_sq.";
constexpr const char* kMomentum = "optimizer.state.momentum_buffer.";
}  // namespace

std::vector<std::string> optimizer_state_prefixes(const OptimizerConfig& c) {
  // Muon takes the 2-D hidden weights; the rest (embeddings, output layer, 1-D weights) is Adam's.
  if (c.optimizer == "adam" || c.optimizer == "muon") return {kExpAvg, kExpAvgSq};
  return {kMomentum};
}

namespace {
std::vector<std::pair<std::string, torch::Tensor>> named(const OptimizerConfig& c,
                                                         const std::pair<torch::Tensor, torch::Tensor>& moments) {
  const auto prefixes = optimizer_state_prefixes(c);
  if (prefixes.size() == 1) return {{prefixes[0], moments.first}};
  return {{prefixes[0], moments.first}, {prefixes[1], moments.second}};
}
}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> optimizer_states_to_save(const OptimizerDomain& o,
                                                                           const OptimizerConfig& c) {
  return named(c, o.moments_to_save());
}

std::vector<std::pair<std::string, torch::Tensor>> optimizer_states_to_load(OptimizerDomain& o, const OptimizerConfig& c) {
  return named(c, o.moments_to_load());
}

std::string state_name(const std::string& prefix, const Slot& slot, const OptimizerConfig& c) {
  if (c.optimizer == "muon" && slot.muon) {
    if (prefix == kExpAvg) return kMomentum + checkpoint_name(slot);
    if (prefix == kExpAvgSq) return "";
  }
  return prefix + checkpoint_name(slot);
}

bool stores_fp8_state(const TrainingState& s, const fp8::Fp8Site& site, bool first_cp) {
  const ParallelState& p = s.parallel;
  const auto& domains = s.optimizer.domains();
  if (domains.size() > 1 && domains[1]->holds(site.parameter)) return p.expert_tp_rank == 0 && p.expert_dp_rank == 0;
  return p.tp_rank == 0 && p.dp_rank == 0 && (!first_cp || p.cp_rank == 0);
}

std::string checkpoint_name(const Slot& slot) { return slot.info.shared_embedding_copy ? kEmbeddingName : slot.name; }

std::vector<Piece> param_pieces(const Slot& slot, int tp_rank, int tp_size) {
  const auto& info = slot.info;
  const std::vector<int64_t>& g = info.global_shape;
  if (info.partition_dim < 0 || tp_size == 1) {
    FP8TRON_CHECK(slot.shape == g, slot.name + ": a replicated parameter's shape differs from its global shape");
    return {Piece{ck::whole(g), 0, slot.numel}};
  }
  const size_t d = size_t(info.partition_dim);
  const int64_t k = info.interleave;
  FP8TRON_CHECK(k == 1 || d == 0, slot.name + ": interleaved partitions are supported along dim 0 only");
  const int64_t block = g[d] / k, piece = block / tp_size;
  std::vector<Piece> pieces;
  for (int64_t j = 0; j < k; ++j) {
    Piece p;
    p.box = ck::whole(g);
    p.box.offset[d] = j * block + tp_rank * piece;
    p.box.shape[d] = piece;
    p.numel = ck::box_volume(p.box);
    p.begin = j * p.numel;
    pieces.push_back(std::move(p));
  }
  std::vector<int64_t> local = g;
  local[d] = k * piece;
  FP8TRON_CHECK(local == slot.shape && k * pieces.front().numel == slot.numel,
                slot.name + ": the local shard does not match its global shape and partition");
  return pieces;
}

const char* bytes_at(const torch::Tensor& t, int64_t element) {
  return static_cast<const char*>(t.data_ptr()) + element * int64_t(t.element_size());
}

}  // namespace fp8tron
