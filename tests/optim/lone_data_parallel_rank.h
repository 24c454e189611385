// A fake data-parallel group for optimizer tests in one process (tests/optim).
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace fp8tron {

// Rank `rank` of a data-parallel group of two, in one process: the reduce-scatter hands this rank
// its own chunk of the input, the all-reduce keeps the local value, and the all-gather writes this
// rank's shard in place (the other rank's part of the buffer keeps whatever it holds). Both
// optimizers under comparison see the same collectives, so their results must agree bitwise.
class LoneDataParallelRank : public Communicator {
 public:
  explicit LoneDataParallelRank(int rank) : Communicator("fake-dp", rank, 2, {0, 1}) {}
  std::unique_ptr<CommWork> all_reduce_async(torch::Tensor&, ReduceOp) override { return done(); }
  std::unique_ptr<CommWork> all_gather_async(torch::Tensor& out, const torch::Tensor& in) override {
    out.narrow(0, in.size(0) * rank_, in.size(0)).copy_(in);
    return done();
  }
  std::unique_ptr<CommWork> reduce_scatter_async(torch::Tensor& out, const torch::Tensor& in) override {
    out.copy_(in.narrow(0, out.size(0) * rank_, out.size(0)));
    return done();
  }
  std::unique_ptr<CommWork> reduce_scatter_v_async(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&) override {
    return unexpected();
  }
  std::unique_ptr<CommWork> all_gather_v_async(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&) override {
    return unexpected();
  }
  std::unique_ptr<CommWork> all_to_all_v_async(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&,
                                               const std::vector<int64_t>&) override {
    return unexpected();
  }
  void broadcast(torch::Tensor&, int) override { unexpected(); }
  std::unique_ptr<CommWork> batch_p2p_async(std::vector<P2POp>) override { return unexpected(); }
  void barrier() override {}

 private:
  struct Done : CommWork {
    void wait() override {}
  };
  static std::unique_ptr<CommWork> done() { return std::make_unique<Done>(); }
  static std::unique_ptr<CommWork> unexpected() {
    ADD_FAILURE() << "unexpected collective";
    return done();
  }
};

}  // namespace fp8tron
