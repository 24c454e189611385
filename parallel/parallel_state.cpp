#include "parallel/parallel_state.h"

#include <algorithm>

#include "core/error.h"

namespace fp8tron {
namespace {

class DoneWork : public CommWork {
 public:
  void wait() override {}
};

class SelfCommunicator : public Communicator {
 public:
  SelfCommunicator(const std::string& name, int global_rank) : Communicator(name, 0, 1, {global_rank}) {}
  std::unique_ptr<CommWork> all_reduce_async(torch::Tensor&, ReduceOp) override { return std::make_unique<DoneWork>(); }
  std::unique_ptr<CommWork> all_gather_async(torch::Tensor& out, const torch::Tensor& in) override {
    if (!out.is_same(in)) out.copy_(in.view_as(out));
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<CommWork> reduce_scatter_async(torch::Tensor& out, const torch::Tensor& in) override {
    if (!out.is_same(in)) out.copy_(in.view_as(out));
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<CommWork> reduce_scatter_v_async(torch::Tensor& out, const torch::Tensor& in,
                                                   const std::vector<int64_t>& counts) override {
    piece_offsets("reduce_scatter_v", in, out, counts);
    if (out.numel() > 0 && out.data_ptr() != in.data_ptr()) out.copy_(in.reshape(out.sizes()));
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<CommWork> all_gather_v_async(torch::Tensor& out, const torch::Tensor& in,
                                               const std::vector<int64_t>& counts) override {
    piece_offsets("all_gather_v", out, in, counts);
    if (out.numel() > 0 && out.data_ptr() != in.data_ptr()) out.copy_(in.reshape(out.sizes()));
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<CommWork> all_to_all_v_async(torch::Tensor& out, const torch::Tensor& in,
                                               const std::vector<int64_t>& send_rows,
                                               const std::vector<int64_t>& recv_rows) override {
    check_all_to_all_v(out, in, send_rows, recv_rows);
    if (out.numel() > 0 && out.data_ptr() != in.data_ptr()) out.copy_(in.view(out.sizes()));
    return std::make_unique<DoneWork>();
  }
  void broadcast(torch::Tensor&, int) override {}
  std::unique_ptr<CommWork> batch_p2p_async(std::vector<P2POp> ops) override {
    FP8TRON_CHECK(ops.empty(), "point-to-point on a group of one rank");
    return std::make_unique<DoneWork>();
  }
  void barrier() override {}
};

}  // namespace

std::shared_ptr<Communicator> make_self_communicator(const std::string& name, int global_rank) {
  return std::make_shared<SelfCommunicator>(name, global_rank);
}

ParallelState single_process_state() {
  ParallelState s;
  s.sizes = ParallelSizes::derive(1, 1, 1, 1, 1, 1, false);
  s.world = s.tp = s.dp = s.pp = s.cp = s.embedding = make_self_communicator("world", 0);
  s.ep = s.expert_tp = s.expert_tp_ep = s.expert_dp = s.tp_cp = s.tp_dp_cp = s.world;
  s.forward_senders = s.backward_senders = {s.pp};
  return s;
}

ParallelState build_parallel_state(std::shared_ptr<Transport> transport, const ParallelSizes& sizes, bool sequence_parallel) {
  ParallelState s;
  s.sizes = sizes;
  s.transport = transport;
  s.progress = transport->progress_board();
  s.sequence_parallel = sequence_parallel;
  s.world_rank = transport->world_rank();
  FP8TRON_CHECK(transport->world_size() == sizes.world_size, "transport and layout disagree on the world size");
  std::vector<int> all(size_t(sizes.world_size));
  for (int i = 0; i < sizes.world_size; ++i) all[size_t(i)] = i;
  s.world = transport->new_group("world", {all});
  auto make = [&](const char* name) {
    auto groups = dense_rank_groups(sizes, name);
    return transport->new_group(name, groups);
  };
  s.tp = make("tp");
  s.cp = make("cp");
  s.dp = make("dp");
  s.pp = make("pp");
  s.tp_rank = s.tp->rank();
  s.cp_rank = s.cp->rank();
  s.dp_rank = s.dp->rank();
  s.pp_rank = s.pp->rank();
  // Expert groups. Every rank takes the same decisions (they depend on the sizes only), so the
  // transport's collective group creation stays in step.
  std::vector<std::pair<std::vector<std::vector<int>>, std::shared_ptr<Communicator>>> built = {
      {dense_rank_groups(sizes, "tp"), s.tp}, {dense_rank_groups(sizes, "dp"), s.dp}, {{all}, s.world}};
  auto expert_group = [&](const std::string& name, const std::string& token) {
    const auto groups = expert_rank_groups(sizes, token);
    for (const auto& [g, comm] : built)
      if (g == groups) return comm;
    const bool singletons = std::all_of(groups.begin(), groups.end(), [](const auto& g) { return g.size() == 1; });
    auto comm = singletons ? make_self_communicator(name, s.world_rank) : transport->new_group(name, groups);
    built.emplace_back(groups, comm);
    return comm;
  };
  s.expert_tp = expert_group("expert-tp", "etp");
  s.ep = expert_group("ep", "ep");
  s.expert_tp_ep = expert_group("expert-tp-ep", "etp-ep");
  s.expert_dp = expert_group("expert-dp", "edp");
  auto dense_group = [&](const std::string& name, const std::string& token) {
    const auto groups = dense_rank_groups(sizes, token);
    for (const auto& [g, comm] : built)
      if (g == groups) return comm;
    auto comm = transport->new_group(name, groups);
    built.emplace_back(groups, comm);
    return comm;
  };
  s.tp_cp = dense_group("tp-cp", "tp-cp");
  s.tp_dp_cp = dense_group("tp-dp-cp", "tp-cp-dp");
  s.ep_rank = s.ep->rank();
  s.expert_tp_rank = s.expert_tp->rank();
  s.expert_dp_rank = s.expert_dp->rank();
  // Embedding groups: first and last rank of every pipeline (just one rank when pp == 1).
  std::vector<std::vector<int>> embedding_groups;
  for (const auto& pipeline : dense_rank_groups(sizes, "pp")) {
    std::vector<int> g = {pipeline.front()};
    if (pipeline.size() > 1) g.push_back(pipeline.back());
    embedding_groups.push_back(g);
  }
  // Middle stages belong to no embedding group: give each its own singleton group.
  std::vector<std::vector<int>> partition = embedding_groups;
  for (const auto& pipeline : dense_rank_groups(sizes, "pp"))
    for (size_t i = 1; i + 1 < pipeline.size(); ++i) partition.push_back({pipeline[i]});
  s.embedding = transport->new_group("embedding", partition);
  const auto pp_groups = dense_rank_groups(sizes, "pp");
  for (int sender = 0; sender < sizes.pp; ++sender) {
    s.forward_senders.push_back(transport->new_group("pp-forward-from-" + std::to_string(sender), pp_groups));
    s.backward_senders.push_back(transport->new_group("pp-backward-from-" + std::to_string(sender), pp_groups));
  }
  return s;
}

}  // namespace fp8tron
