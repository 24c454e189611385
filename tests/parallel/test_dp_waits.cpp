// The data-parallel buffers wait for their operations through the group's wait observer, the hook
// that times the exposed data-parallel communication (dp-comm-exposed, parallel/overlap/comm_timer.h):
// a data-parallel group of two is simulated by a communicator whose operations complete at once,
// and an observer counts the waits it sees.
#include <gtest/gtest.h>

#include "parallel/grad_buckets.h"
#include "parallel/param_gather.h"

namespace fp8tron {
namespace {

class DoneWork : public CommWork {
 public:
  void wait() override {}
};

// Rank `rank` of two; every operation is done when issued and changes nothing.
class InstantComm : public Communicator {
 public:
  explicit InstantComm(int rank) : Communicator("fake-dp", rank, 2, {0, 1}) {}
  std::unique_ptr<CommWork> all_reduce_async(torch::Tensor&, ReduceOp) override { return done(); }
  std::unique_ptr<CommWork> all_gather_async(torch::Tensor&, const torch::Tensor&) override { return done(); }
  std::unique_ptr<CommWork> reduce_scatter_async(torch::Tensor&, const torch::Tensor&) override { return done(); }
  std::unique_ptr<CommWork> reduce_scatter_v_async(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&) override {
    return done();
  }
  std::unique_ptr<CommWork> all_gather_v_async(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&) override {
    return done();
  }
  std::unique_ptr<CommWork> all_to_all_v_async(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&,
                                               const std::vector<int64_t>&) override {
    return done();
  }
  void broadcast(torch::Tensor&, int) override {}
  std::unique_ptr<CommWork> batch_p2p_async(std::vector<P2POp>) override { return done(); }
  void barrier() override {}

 private:
  static std::unique_ptr<CommWork> done() { return std::make_unique<DoneWork>(); }
};

class CountingObserver : public WaitObserver {
 public:
  int waits = 0;
  void wait(CommWork& work) override {
    ++waits;
    work.wait();
  }
};

// Three parameters of four elements in a flat buffer of twelve.
struct Buffer {
  std::vector<torch::Tensor> tensors;
  std::vector<BufferParam> layout;
  torch::Tensor flat = torch::zeros({12});
  Buffer() {
    for (int64_t i = 0; i < 3; ++i) {
      tensors.push_back(torch::zeros({4}, torch::requires_grad()));
      layout.push_back(BufferParam{tensors.back(), 4 * i, 4, i});
    }
  }
};

TEST(DataParallelWaits, ObserverIsVisible) {
  InstantComm comm(0);
  EXPECT_FALSE(comm.has_wait_observer());
  comm.set_wait_observer(std::make_shared<CountingObserver>());
  EXPECT_TRUE(comm.has_wait_observer());
}

TEST(DataParallelWaits, GradBucketsWaitThroughTheGroupsObserver) {
  for (int64_t shard_numel : {0, 6}) {  // all-reduces; the distributed optimizer's reduce-scatters
    SCOPED_TRACE("shard_numel " + std::to_string(shard_numel));
    Buffer b;
    auto dp = std::make_shared<InstantComm>(0);
    auto observer = std::make_shared<CountingObserver>();
    dp->set_wait_observer(observer);
    GradBuckets::Options options;
    options.bucket_numel = 4;
    options.shard_numel = shard_numel;
    GradBuckets buckets(b.flat, b.layout, options, dp);
    ASSERT_EQ(buckets.num_buckets(), 3u);
    buckets.arm();
    buckets.finish();  // launches the buckets (no gradient arrived) and waits for them
    EXPECT_EQ(observer->waits, 3);
  }
}

// Optimizer instances: rank 0 owns [0, 6), so buckets 0 and 1 hold a piece of its shard, which is
// all-reduced over the replicas once the instance's reduce-scatter is done (on the CPU the host
// waits for it then, through the instance's observer); bucket 2 holds none.
TEST(DataParallelWaits, GradBucketsAcrossInstancesWaitThroughBothObservers) {
  Buffer b;
  auto dp = std::make_shared<InstantComm>(0), replicas = std::make_shared<InstantComm>(0);
  auto dp_observer = std::make_shared<CountingObserver>(), replica_observer = std::make_shared<CountingObserver>();
  dp->set_wait_observer(dp_observer);
  replicas->set_wait_observer(replica_observer);
  GradBuckets::Options options;
  options.bucket_numel = 4;
  options.shard_numel = 6;
  options.replicas = replicas;
  GradBuckets buckets(b.flat, b.layout, options, dp);
  buckets.arm();
  buckets.finish();
  EXPECT_EQ(dp_observer->waits, 3);       // two reduce-scatters before their all-reduce, bucket 2's at the end
  EXPECT_EQ(replica_observer->waits, 2);  // the two all-reduces
}

TEST(DataParallelWaits, ParamGatherWaitsThroughTheGroupsObserver) {
  Buffer b;
  auto dp = std::make_shared<InstantComm>(1);
  auto observer = std::make_shared<CountingObserver>();
  dp->set_wait_observer(observer);
  ParamGather gather(b.flat, b.layout, /*bucket_numel=*/4, /*shard_numel=*/6, dp);
  ASSERT_EQ(gather.num_buckets(), 3u);
  gather.start();
  gather.finish();
  EXPECT_EQ(observer->waits, 3);
}

}  // namespace
}  // namespace fp8tron
