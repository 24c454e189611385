// --overlap-param-gather's waits, in one process: a data-parallel group of two is simulated by a
// communicator whose all-gather delivers the other rank's weights only when its work is waited
// for (a transport that makes no progress on its own), so any weight the forward pass reads
// before waiting for its bucket is visibly stale.
#include <gtest/gtest.h>

#include <functional>

#include "models/gpt_model.h"
#include "optim/optimizer_domain.h"
#include "parallel/param_gather.h"
#include "tests/test_helpers.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;

class FunctionWork : public CommWork {
 public:
  explicit FunctionWork(std::function<void()> f) : f_(std::move(f)) {}
  void wait() override {
    if (f_) f_();
    f_ = nullptr;
  }

 private:
  std::function<void()> f_;
};

// A data-parallel group of two whose only collective is the all-gather a fake below defines: any
// other collective fails the test.
class GatherOnlyComm : public Communicator {
 public:
  explicit GatherOnlyComm(int rank) : Communicator("fake-dp", rank, 2, {0, 1}) {}
  std::unique_ptr<CommWork> all_reduce_async(torch::Tensor&, ReduceOp) override { return unexpected(); }
  std::unique_ptr<CommWork> all_gather_async(torch::Tensor&, const torch::Tensor&) override { return unexpected(); }
  std::unique_ptr<CommWork> reduce_scatter_async(torch::Tensor&, const torch::Tensor&) override { return unexpected(); }
  std::unique_ptr<CommWork> reduce_scatter_v_async(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&) override {
    return unexpected();
  }
  std::unique_ptr<CommWork> all_to_all_v_async(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&,
                                               const std::vector<int64_t>&) override {
    return unexpected();
  }
  void broadcast(torch::Tensor&, int) override { unexpected(); }
  std::unique_ptr<CommWork> batch_p2p_async(std::vector<P2POp>) override { return unexpected(); }
  void barrier() override { unexpected(); }

 protected:
  static std::unique_ptr<CommWork> unexpected() {
    ADD_FAILURE() << "unexpected collective";
    return std::make_unique<FunctionWork>(nullptr);
  }
};

// Rank `rank` of two; `truth` is what the whole buffer holds once gathered.
class DeferredGatherComm : public GatherOnlyComm {
 public:
  DeferredGatherComm(int rank, torch::Tensor buffer, torch::Tensor truth)
      : GatherOnlyComm(rank), buffer_(std::move(buffer)), truth_(std::move(truth)) {}
  int issued = 0, completed = 0;

  std::unique_ptr<CommWork> all_gather_v_async(torch::Tensor& out, const torch::Tensor& in,
                                               const std::vector<int64_t>& counts) override {
    const auto offsets = piece_offsets("all_gather_v", out, in, counts);
    const int64_t element = buffer_.element_size();
    const int64_t base = (static_cast<char*>(out.data_ptr()) - static_cast<char*>(buffer_.data_ptr())) / element;
    if (in.numel() > 0)
      EXPECT_EQ(in.data_ptr(), static_cast<char*>(out.data_ptr()) + offsets[size_t(rank_)] * element) << "gathers in place";
    ++issued;
    torch::Tensor target = out;
    return std::make_unique<FunctionWork>([this, target, offsets, counts, base]() mutable {
      for (int r = 0; r < size_; ++r)
        if (r != rank_) target.narrow(0, offsets[size_t(r)], counts[size_t(r)]).copy_(truth_.narrow(0, base + offsets[size_t(r)], counts[size_t(r)]));
      ++completed;
    });
  }

 private:
  torch::Tensor buffer_, truth_;
};

struct Batch {
  torch::Tensor tokens, labels, mask;
};

Batch batch(int64_t vocab) {
  torch::manual_seed(3);
  return {torch::randint(vocab, {2, 16}, torch::kLong), torch::randint(vocab, {2, 16}, torch::kLong), torch::ones({2, 16})};
}

void check_forward_waits(const std::vector<std::string>& flags, int rank) {
  auto args = tiny_args({"--attention-dropout", "0", "--hidden-dropout", "0"});
  args.insert(args.end(), flags.begin(), flags.end());
  const ModelConfig config = build(args).model;
  GptModel model(config);
  model->eval();
  torch::NoGradGuard no_grad;
  const Batch b = batch(config.vocab_size);
  const double reference = model->loss(b.tokens, b.labels, b.mask).item<double>();

  // A flat buffer in reverse model order, so that offset order is not forward order (as in the
  // optimizer's buffer, ordered by weight decay first).
  auto params = model->parameters();
  int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  const int64_t padded = (total + 1) / 2 * 2, shard = padded / 2;
  auto flat = torch::zeros({padded});
  std::vector<BufferParam> layout;
  int64_t offset = 0;
  for (int64_t i = int64_t(params.size()) - 1; i >= 0; --i) {
    auto& p = params[size_t(i)];
    const int64_t n = p.numel();
    flat.narrow(0, offset, n).copy_(p.reshape({-1}));
    p.set_data(flat.narrow(0, offset, n).view(p.sizes()));
    layout.push_back(BufferParam{p, offset, n, i});
    offset += n;
  }
  const auto truth = flat.clone();
  // The other rank's shard holds stale values until its buckets are gathered.
  flat.narrow(0, (1 - rank) * shard, shard).copy_(torch::randn({shard}, torch::kFloat32));
  auto comm = std::make_shared<DeferredGatherComm>(rank, flat, truth);
  ParamGather gather(flat, layout, /*bucket_numel=*/1500, shard, comm);
  ASSERT_GT(gather.num_buckets(), 6u);
  gather.start();
  EXPECT_EQ(comm->issued, int(gather.num_buckets()));
  EXPECT_TRUE(gather.in_flight());

  int parts = 0, completed_after_first_part = -1;
  model->set_params_ready_hook([&](const torch::nn::Module& part) {
    gather.wait_for(part);
    if (parts++ == 0) completed_after_first_part = comm->completed;
  });
  const double loss = model->loss(b.tokens, b.labels, b.mask).item<double>();
  EXPECT_EQ(loss, reference) << "a weight was read before its all-gather landed";
  EXPECT_GT(completed_after_first_part, 0);
  EXPECT_LT(completed_after_first_part, comm->issued) << "the embedding waited for more than its own buckets";
  EXPECT_FALSE(gather.in_flight()) << "every weight is used by the forward pass";
  EXPECT_TRUE(torch::equal(flat, truth));
}

TEST(ParamGather, ForwardWaitsForEveryBucketItReads) {
  for (int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    check_forward_waits({}, rank);
    check_forward_waits({"--untie-embeddings-and-output-weights", "--swiglu", "--qk-layernorm"}, rank);
  }
}

TEST(ParamGather, FinishWaitsForAll) {
  auto flat = torch::arange(20, torch::kFloat32);
  const auto truth = flat.clone();
  flat.narrow(0, 10, 10).zero_();
  std::vector<BufferParam> layout;
  for (int64_t i = 0; i < 5; ++i) layout.push_back(BufferParam{torch::Tensor(), 4 * i, 4, i});
  auto comm = std::make_shared<DeferredGatherComm>(0, flat, truth);
  ParamGather gather(flat, layout, 4, 10, comm);
  EXPECT_EQ(gather.num_buckets(), 5u);
  gather.start();
  EXPECT_FALSE(torch::equal(flat, truth));
  gather.finish();
  EXPECT_FALSE(gather.in_flight());
  EXPECT_TRUE(torch::equal(flat, truth));
  EXPECT_EQ(comm->completed, 5);
}

// --overlap-param-gather-with-optimizer-step: buckets end where the model chunk changes, and the
// first chunk's are issued on their own, before the others'.
TEST(ParamGather, FirstChunkBucketsStartAlone) {
  auto flat = torch::arange(24, torch::kFloat32);
  const auto truth = flat.clone();
  flat.narrow(0, 12, 12).zero_();  // rank 1's shard, stale until gathered
  // Chunks by offset, as the optimizer's buffer interleaves them: 0 0 1 1 0 1 (4 elements each).
  const std::vector<int> chunks = {0, 0, 1, 1, 0, 1};
  std::vector<BufferParam> layout;
  for (int64_t i = 0; i < 6; ++i) layout.push_back(BufferParam{torch::Tensor(), 4 * i, 4, i, chunks[size_t(i)]});
  auto comm = std::make_shared<DeferredGatherComm>(0, flat, truth);
  ParamGather merged(flat, layout, /*bucket_numel=*/100, 12, comm);
  EXPECT_EQ(merged.num_buckets(), 1u) << "without the split one bucket holds everything";
  ParamGather gather(flat, layout, /*bucket_numel=*/100, 12, comm, {}, /*split_chunks=*/true);
  EXPECT_EQ(gather.num_buckets(), 4u);  // [0, 8) [8, 16) [16, 20) [20, 24)
  gather.start_first_chunk();
  EXPECT_EQ(comm->issued, 2);
  EXPECT_EQ(gather.buckets_in_flight(), 2);
  gather.start_other_chunks();
  EXPECT_EQ(comm->issued, 4);
  gather.finish();
  EXPECT_TRUE(torch::equal(flat, truth));
}

// Rank `rank` of a data-parallel group of two whose all-gathers deliver nothing (the other rank's
// part of the buffer keeps its values), counting them.
class CountingGatherComm : public GatherOnlyComm {
 public:
  explicit CountingGatherComm(int rank) : GatherOnlyComm(rank) {}
  int issued = 0;
  std::unique_ptr<CommWork> all_gather_v_async(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&) override {
    ++issued;
    return std::make_unique<FunctionWork>(nullptr);
  }
};

// --overlap-param-gather-with-optimizer-step in one optimizer domain of a data-parallel rank of two:
// stepping the first model chunk's parameters first, then the others', gives bitwise the main
// weights, Adam moments and model weights of one step over everything, and issues the first
// chunk's all-gathers while the other chunks' parameters are still to be updated. Parameter sizes
// are not multiples of a SIMD vector, and the chunks interleave in both segments (decayed weights,
// undecayed biases), so cuts anywhere inside the CPU fused Adam's vector runs would show.
TEST(ParamGather, FirstChunkStepIsBitwiseTheWholeStep) {
  const std::vector<std::vector<int64_t>> shapes = {{10, 13}, {37}, {25, 10}, {90}, {7, 11}, {45}, {30, 10}, {200}, {131}};
  for (int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    std::vector<std::unique_ptr<OptimizerDomain>> domains;
    std::vector<std::shared_ptr<CountingGatherComm>> comms;
    for (bool with_step : {false, true}) {
      std::vector<NamedParam> params;
      torch::manual_seed(11);
      for (size_t i = 0; i < shapes.size(); ++i) {
        const std::string kind = shapes[i].size() == 2 ? ".weight" : ".bias";
        params.push_back({"decoder.layers." + std::to_string(i) + ".mlp.linear_fc1" + kind,
                          torch::randn(shapes[i]).requires_grad_(true), ParamInfo{}, int(i % 2)});
      }
      comms.push_back(std::make_shared<CountingGatherComm>(rank));
      DomainGroups groups;
      groups.name = "dense";
      groups.dp = comms.back();
      groups.tp = make_self_communicator("tp", rank);
      domains.push_back(std::make_unique<OptimizerDomain>(params, OptimizerConfig{}, PrecisionConfig{}, groups,
                                                          /*distributed=*/true, torch::Device(torch::kCPU)));
      ASSERT_TRUE(domains.back()->distributed());
      domains.back()->enable_param_gather_overlap(/*bucket_numel=*/200, with_step);
    }
    for (int step = 0; step < 3; ++step) {
      torch::manual_seed(100 + step);
      const auto values = torch::randn({domains[0]->shard_numel()});
      for (auto& d : domains) {
        auto grads = d->unscaled_grads({});
        grads.copy_(values);
        d->update(grads, /*lr=*/1e-2, /*weight_decay=*/0.1, torch::zeros({}));
        d->finish_param_gather();
      }
    }
    EXPECT_TRUE(torch::equal(domains[0]->main_params(), domains[1]->main_params()));
    EXPECT_TRUE(torch::equal(domains[0]->exp_avg(), domains[1]->exp_avg()));
    EXPECT_TRUE(torch::equal(domains[0]->exp_avg_sq(), domains[1]->exp_avg_sq()));
    EXPECT_TRUE(torch::equal(domains[0]->model_params(), domains[1]->model_params()));
    EXPECT_EQ(domains[0]->param_gathers_during_step(), 0);
    EXPECT_GT(domains[1]->param_gathers_during_step(), 0);
    EXPECT_LT(domains[1]->param_gathers_during_step(), comms[1]->issued) << "the other chunk's buckets come after";
  }
}

}  // namespace
}  // namespace fp8tron
