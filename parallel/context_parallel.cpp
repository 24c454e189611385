#include "parallel/context_parallel.h"

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kAllToAllTag = 7;

void save_comm(AutogradContext* ctx, Communicator& comm) { ctx->saved_data["comm"] = int64_t(reinterpret_cast<intptr_t>(&comm)); }
Communicator& load_comm(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(intptr_t(ctx->saved_data["comm"].toInt()));
}

// parts[j] goes to group rank j (all of one shape); returns what every rank sent to this one, in
// rank order. One batch of sends and receives: paired exchanges cannot deadlock.
std::vector<torch::Tensor> all_to_all_parts(Communicator& group, const std::vector<torch::Tensor>& parts) {
  const int n = group.size(), me = group.rank();
  std::vector<torch::Tensor> received(static_cast<size_t>(n));
  std::vector<Communicator::P2POp> ops;
  for (int j = 0; j < n; ++j) {
    const torch::Tensor part = parts[size_t(j)].contiguous();
    if (j == me) {
      received[size_t(j)] = part;
      continue;
    }
    received[size_t(j)] = torch::empty_like(part);
    ops.push_back({true, part, j, kAllToAllTag});
    ops.push_back({false, received[size_t(j)], j, kAllToAllTag});
  }
  if (!ops.empty()) group.batch_p2p_async(std::move(ops))->wait();
  return received;
}

torch::Tensor sequence_to_heads(const torch::Tensor& x, Communicator& group) {
  const int a = group.size();
  const int64_t heads = x.size(2);
  FP8TRON_CHECK(heads % a == 0, strprintf("context-parallel all-to-all: %lld heads on this rank are not divisible by %d",
                                          (long long)heads, a));
  std::vector<torch::Tensor> parts;
  for (int j = 0; j < a; ++j) parts.push_back(x.narrow(2, j * (heads / a), heads / a));
  return cp_unshard(all_to_all_parts(group, parts), 0);
}

torch::Tensor heads_to_sequence(const torch::Tensor& x, Communicator& group) {
  const int a = group.size();
  std::vector<torch::Tensor> parts;
  for (int j = 0; j < a; ++j) parts.push_back(cp_shard(x, 0, a, j));
  return torch::cat(all_to_all_parts(group, parts), 2);
}

torch::Tensor gather_sequence(const torch::Tensor& x, Communicator& group) {
  const int n = group.size();
  auto in = x.contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] *= n;
  auto all = torch::empty(sizes, in.options());
  group.all_gather(all, in);
  return cp_unshard(all.chunk(n, 0), 0);
}

torch::Tensor scatter_sequence_grad(const torch::Tensor& g, Communicator& group) {
  const int n = group.size();
  std::vector<torch::Tensor> parts;
  for (int j = 0; j < n; ++j) parts.push_back(cp_shard(g, 0, n, j));
  auto all = torch::cat(parts, 0);
  auto sizes = all.sizes().vec();
  sizes[0] /= n;
  auto mine = torch::empty(sizes, all.options());
  group.reduce_scatter(mine, all);
  return mine;
}

struct SequenceToHeads : torch::autograd::Function<SequenceToHeads> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* group) {
    save_comm(ctx, *group);
    return sequence_to_heads(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) { return {heads_to_sequence(g[0], load_comm(ctx)), {}}; }
};
struct HeadsToSequence : torch::autograd::Function<HeadsToSequence> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* group) {
    save_comm(ctx, *group);
    return heads_to_sequence(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) { return {sequence_to_heads(g[0], load_comm(ctx)), {}}; }
};
struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* group) {
    save_comm(ctx, *group);
    return gather_sequence(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {scatter_sequence_grad(g[0], load_comm(ctx)), {}};
  }
};

// Megatron's create_hierarchical_groups for one level: members [l][s][u] of each group (u of the
// earlier levels fastest), grouped over s.
std::vector<std::vector<int>> hierarchical_level(const std::vector<std::vector<int>>& groups, const std::vector<int>& sizes,
                                                 size_t level) {
  int inner = 1, outer = 1;  // the sizes of the earlier and of the later levels
  for (size_t i = 0; i < level; ++i) inner *= sizes[i];
  for (size_t i = level + 1; i < sizes.size(); ++i) outer *= sizes[i];
  const int span = sizes[level];
  std::vector<std::vector<int>> out;
  for (const auto& g : groups)
    for (int l = 0; l < outer; ++l)
      for (int u = 0; u < inner; ++u) {
        std::vector<int> members;
        for (int s = 0; s < span; ++s) members.push_back(g[size_t(l * span * inner + s * inner + u)]);
        out.push_back(std::move(members));
      }
  return out;
}

}  // namespace

std::pair<int64_t, int64_t> cp_chunks(int size, int rank) { return {rank, 2 * int64_t(size) - 1 - rank}; }

torch::Tensor cp_positions(int64_t seq_length, int size, int rank) {
  return cp_shard(torch::arange(seq_length, torch::kInt64), 0, size, rank);
}

torch::Tensor cp_shard(const torch::Tensor& x, int64_t dim, int size, int rank) {
  if (size == 1) return x.contiguous();
  FP8TRON_CHECK(x.size(dim) % (2 * size) == 0,
                strprintf("context parallelism: a sequence of %lld is not divisible into 2 x %d chunks", (long long)x.size(dim), size));
  const int64_t c = x.size(dim) / (2 * size);
  const auto [first, second] = cp_chunks(size, rank);
  return torch::cat({x.narrow(dim, first * c, c), x.narrow(dim, second * c, c)}, dim);
}

torch::Tensor cp_unshard(const std::vector<torch::Tensor>& parts, int64_t dim) {
  const size_t n = parts.size();
  if (n == 1) return parts[0].contiguous();
  const int64_t c = parts[0].size(dim) / 2;
  std::vector<torch::Tensor> chunks;
  for (size_t k = 0; k < n; ++k) chunks.push_back(parts[k].narrow(dim, 0, c));
  for (size_t k = 0; k < n; ++k) chunks.push_back(parts[n - 1 - k].narrow(dim, c, c));
  return torch::cat(chunks, dim);
}

torch::Tensor cp_roll_left(const torch::Tensor& x, int64_t dim, Communicator& group) {
  const int n = group.size(), r = group.rank();
  const int64_t len = x.size(dim);
  auto out = torch::zeros_like(x);
  if (n == 1) {
    out.narrow(dim, 0, len - 1).copy_(x.narrow(dim, 1, len - 1));
    return out;
  }
  FP8TRON_CHECK(len % 2 == 0, "cp_roll_left: a shard is two equal chunks");
  const int64_t c = len / 2;
  // Each chunk moves one position left within itself; its last position waits for the head of
  // the chunk that follows it in the sequence.
  for (int64_t k : {int64_t(0), c}) out.narrow(dim, k, c - 1).copy_(x.narrow(dim, k + 1, c - 1));
  const auto my_first = x.select(dim, 0).contiguous(), my_second = x.select(dim, c).contiguous();  // the heads
  torch::Tensor first_tail, second_tail;  // what lands at positions c - 1 and 2c - 1
  std::vector<Communicator::P2POp> ops;
  constexpr int kToPrevious = 21, kToNext = 22;
  if (r + 1 < n) {
    first_tail = torch::empty_like(my_first);
    ops.push_back({false, first_tail, r + 1, kToPrevious});  // chunk r + 1 is rank r + 1's first
    ops.push_back({true, my_second, r + 1, kToNext});        // our second chunk follows theirs
  } else {
    first_tail = my_second;  // chunk `size` is this rank's own second chunk
  }
  if (r > 0) {
    ops.push_back({true, my_first, r - 1, kToPrevious});
    second_tail = torch::empty_like(my_first);
    ops.push_back({false, second_tail, r - 1, kToNext});  // chunk 2 size - r is rank r - 1's second
  }
  if (!ops.empty()) group.batch_p2p_async(std::move(ops))->wait();
  out.select(dim, c - 1).copy_(first_tail);
  if (second_tail.defined()) out.select(dim, 2 * c - 1).copy_(second_tail);  // rank 0: the sequence's end, 0
  return out;
}

ContextParallelGroups build_context_parallel_groups(const ParallelState& s, const std::vector<int>& hierarchical_sizes) {
  ContextParallelGroups g;
  if (s.sizes.cp == 1) {
    g.dp_cp = s.dp;
    return g;
  }
  FP8TRON_CHECK(s.transport != nullptr, "context-parallel groups need the job's transport");
  g.dp_cp = s.transport->new_group("dp-cp", dense_rank_groups(s.sizes, "cp-dp"));
  if (hierarchical_sizes.empty()) return g;
  FP8TRON_CHECK(hierarchical_sizes.size() == 2, "hierarchical context parallelism takes two levels (a2a, p2p)");
  const auto cp_groups = dense_rank_groups(s.sizes, "cp");
  g.a2a_level = s.transport->new_group("cp-a2a", hierarchical_level(cp_groups, hierarchical_sizes, 0));
  g.p2p_level = s.transport->new_group("cp-p2p", hierarchical_level(cp_groups, hierarchical_sizes, 1));
  return g;
}

ParallelState with_context_parallel_in_data_parallel(const ParallelState& s, std::shared_ptr<Communicator> dp_cp) {
  if (s.sizes.cp == 1) return s;
  ParallelState v = s;
  v.dp = std::move(dp_cp);
  v.dp_rank = v.dp->rank();
  v.sizes.dp = s.sizes.dp * s.sizes.cp;
  v.sizes.cp = 1;
  v.cp = make_self_communicator("cp", s.world_rank);
  v.cp_rank = 0;
  return v;
}

torch::Tensor cp_sequence_to_heads(const torch::Tensor& x, Communicator& group) {
  return group.size() == 1 ? x : SequenceToHeads::apply(x, &group);
}
torch::Tensor cp_heads_to_sequence(const torch::Tensor& x, Communicator& group) {
  return group.size() == 1 ? x : HeadsToSequence::apply(x, &group);
}
torch::Tensor cp_gather_sequence(const torch::Tensor& x, Communicator& group) {
  return group.size() == 1 ? x : GatherSequence::apply(x, &group);
}

std::unique_ptr<CommWork> ring_exchange(Communicator& ring, const torch::Tensor& send, torch::Tensor& recv, int tag) {
  const int n = ring.size(), r = ring.rank();
  FP8TRON_CHECK(send.is_contiguous() && recv.is_contiguous() && send.numel() == recv.numel(),
                "ring exchange: contiguous buffers of one size");
  return ring.batch_p2p_async({{true, send, (r + 1) % n, tag}, {false, recv, (r + n - 1) % n, tag}});
}

}  // namespace fp8tron
