#include "parallel/sharding.h"

#include <ATen/CPUGeneratorImpl.h>

#include "core/error.h"

namespace fp8tron {
namespace {
uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}
}  // namespace

torch::Tensor ParamFactory::normal(const std::string& init_name, const ParamInfo& info, double std) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(fnv1a(init_name, 0xcbf29ce484222325ULL ^ seed_));
  auto global = at::normal(0.0, std, info.global_shape, gen);
  return shard(global, info);
}

torch::Tensor ParamFactory::constant(const ParamInfo& info, double value) const {
  return shard(torch::full(info.global_shape, value), info);
}

torch::Tensor ParamFactory::shard(const torch::Tensor& global, const ParamInfo& info) const {
  if (info.partition_dim < 0 || tp_.size == 1) return global.clone();
  const int64_t dim = info.partition_dim;
  auto blocks = global.chunk(info.interleave, dim);
  std::vector<torch::Tensor> mine;
  for (auto& b : blocks) {
    FP8TRON_CHECK(b.size(dim) % tp_.size == 0, "a partitioned dimension is not divisible by the tensor-parallel size");
    mine.push_back(b.chunk(tp_.size, dim)[size_t(tp_.rank)]);
  }
  return torch::cat(mine, dim).contiguous();
}

torch::Tensor gather_global_param(const torch::Tensor& shard, const ParamInfo& info, Communicator& tp) {
  if (info.partition_dim < 0 || tp.size() == 1) return shard.clone();
  const int64_t dim = info.partition_dim;
  auto moved = shard.transpose(0, dim).contiguous();  // partitioned dim first: shards concatenate
  auto sizes = moved.sizes().vec();
  sizes[0] *= tp.size();
  auto all = torch::empty(sizes, moved.options());
  tp.all_gather(all, moved);
  auto per_rank = all.chunk(tp.size(), 0);
  // Each rank's shard holds one piece of each interleaved block: block b = cat over ranks.
  std::vector<torch::Tensor> blocks;
  for (int b = 0; b < info.interleave; ++b) {
    std::vector<torch::Tensor> pieces;
    for (auto& r : per_rank) pieces.push_back(r.chunk(info.interleave, 0)[size_t(b)]);
    blocks.push_back(torch::cat(pieces, 0));
  }
  return torch::cat(blocks, 0).transpose(0, dim).contiguous();
}

std::map<std::string, ParamInfo> collect_param_infos(const torch::nn::Module& root) {
  std::map<std::string, ParamInfo> out;
  for (const auto& item : root.named_modules()) {
    const auto* sharded = dynamic_cast<const ShardedModule*>(item.value().get());
    if (!sharded) continue;
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& [name, info] : sharded->param_infos()) out[prefix + name] = info;
  }
  return out;
}

}  // namespace fp8tron
