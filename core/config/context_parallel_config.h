// Context parallelism (--context-parallel-size, --cp-comm-type, --hierarchical-context-parallel-sizes):
// how attention is computed when the sequence is split over the context-parallel ranks. The rank
// grid's size is ParallelSizes::cp; parallel/context_parallel.h builds the groups and models/ the
// attention from this.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fp8tron {

// Transformer Engine's names (Megatron passes --cp-comm-type through to it).
enum class CpCommType {
  P2P,        // ring attention: key/value blocks passed around the ring, partial results merged
  A2A,        // Ulysses: all-to-all from sequence shards to head shards and back
  AllGather,  // keys/values all-gathered before attention
  A2AP2P,     // hierarchical: all-to-all in the first level, ring over the second
};

struct ContextParallelConfig {
  // One entry for every layer, or one per layer (--cp-comm-type p2p p2p a2a ...).
  std::vector<CpCommType> comm_types = {CpCommType::P2P};
  // --hierarchical-context-parallel-sizes: [a2a level, p2p level] (a2a+p2p); empty when not given.
  std::vector<int> hierarchical_sizes;

  CpCommType comm_type(int64_t layer) const {
    return comm_types.size() == 1 ? comm_types.front() : comm_types.at(size_t(layer));
  }
};

inline const char* cp_comm_type_name(CpCommType t) {
  switch (t) {
    case CpCommType::P2P: return "p2p";
    case CpCommType::A2A: return "a2a";
    case CpCommType::AllGather: return "all_gather";
    case CpCommType::A2AP2P: return "a2a+p2p";
  }
  return "?";
}

}  // namespace fp8tron
