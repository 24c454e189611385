// Where each parameter of an optimizer domain lies in its flat buffer, and the equal contiguous
// shards the distributed optimizer gives the data-parallel ranks (rank r owns
// [r * shard_numel, (r + 1) * shard_numel)).
//
// Most parameters are updated elementwise (Adam, SGD), so a shard boundary may cut them anywhere:
// they are laid out back to back from offset 0 (Megatron's DistributedOptimizer). A parameter
// that must stay whole (Muon's matrices: Newton-Schulz orthogonalises the whole matrix) lies
// entirely inside one rank's shard, as Megatron's LayerWiseDistributedOptimizer places them:
// whole parameters go, most expensive first (cost: Newton-Schulz ~ max(m, n) min(m, n)^2), to
// the shard with the least cost so far that still has room, and the shards grow until they all
// fit. Gaps left in a shard are padding (zeros, never a parameter's). The layout depends only on
// the parameters' sizes, so every rank of a data- or tensor-parallel group computes the same one
// (tensor-parallel ranks hold equally shaped shards of each weight).
#pragma once
#include <cstdint>
#include <vector>

namespace fp8tron {

struct LayoutParam {
  int64_t numel = 0;
  bool whole = false;  // must lie inside one shard
  double cost = 0;     // balances the whole parameters over the shards
};

struct BufferLayout {
  std::vector<int64_t> offsets;  // per parameter, in the order given
  int64_t numel = 0;             // the end of the last parameter
  int64_t shard_numel = 0;       // each rank's shard: the buffer holds ranks x shard_numel elements
};

// `ranks`: the data-parallel ranks sharing the buffer (1: not distributed, everything back to back).
BufferLayout plan_buffer_layout(const std::vector<LayoutParam>& params, int ranks);

// Newton-Schulz's cost of an m x n matrix (the balancing weight of a whole parameter).
double newton_schulz_cost(int64_t m, int64_t n);

}  // namespace fp8tron
