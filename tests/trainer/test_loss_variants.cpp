// Loss normalisation and data-order variants through the trainer, against the same gradients
// computed by hand from a model with the same (layout-independent) initial weights:
// --calculate-per-token-loss, the tokenizer's pad id masked out of the loss, the batch-size
// ramp-up's consumed samples, the cyclic sampler's order (reference: torch.randperm with a
// generator seeded by the epoch), --no-create-attention-mask-in-dataloader.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include "core/config/batch_schedule.h"
#include "data/gpt_inputs.h"
#include "data/loader/batch_loader.h"
#include "data/loader/builtin_datasets.h"
#include "data/loader/cyclic_source.h"
#include "models/gpt_model.h"
#include "tests/test_helpers.h"
#include "trainer/trainer.h"

namespace fp8tron {
using namespace fp8tron::testing;

// Mock documents over a 16-id NullTokenizer with pad id 5: labels 5 are masked out, so the two
// 20-token micro-batches have different loss-token counts (18 and 19).
std::vector<std::string> mock_args(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "20",
                                "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "1", "--lr", "0.5",
                                "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "16",
                                "--null-tokenizer-pad-id", "5", "--optimizer", "sgd", "--sgd-momentum", "0", "--clip-grad", "0",
                                "--weight-decay", "0", "--attention-dropout", "0", "--hidden-dropout", "0", "--eval-iters", "0",
                                "--log-interval", "1000", "--make-vocab-size-divisible-by", "16", "--num-workers", "0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The SGD step's expected weights: w0 - lr x the gradient of `per_token` ? sum ce / N : mean of
// micro-batch means, over the run's two micro-batches (samples 0 and 1).
std::map<std::string, torch::Tensor> expected_weights(const Config& c, bool per_token) {
  GptModel model(c.model);
  auto source = make_mock_source(c.model.seq_length, c.model.vocab_size, c.data.eod, c.training.seed);
  std::vector<torch::Tensor> sums, counts;
  for (int64_t sample = 0; sample < 2; ++sample) {
    std::vector<int64_t> raw(size_t(c.model.seq_length + 1));
    source->sample(Split::Train, sample, raw.data());
    const int64_t s = c.model.seq_length;
    auto tokens = torch::empty({1, s}, torch::kInt64), labels = torch::empty({1, s}, torch::kInt64),
         positions = torch::empty({1, s}, torch::kInt64);
    auto mask = torch::empty({1, s}, torch::kFloat32);
    data::GptInputOptions o;
    o.pad = c.data.pad;
    data::make_gpt_inputs(raw.data(), s, c.data.eod, o, tokens.data_ptr<int64_t>(), labels.data_ptr<int64_t>(),
                          mask.data_ptr<float>(), positions.data_ptr<int64_t>(), nullptr);
    model->set_per_token_loss(true);
    sums.push_back(model->forward_stage(tokens, labels, mask));
    counts.push_back(mask.sum());
  }
  EXPECT_NE(counts[0].item<double>(), counts[1].item<double>()) << "the test needs uneven loss-token counts";
  auto objective = per_token ? (sums[0] + sums[1]) / (counts[0] + counts[1])
                             : (sums[0] / counts[0] + sums[1] / counts[1]) / 2.0;
  objective.backward();
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model->named_parameters())
    out[item.key()] = (item.value() - c.optimizer.lr * item.value().grad()).detach();
  return out;
}

double max_difference(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b) {
  double worst = 0;
  for (const auto& [name, t] : a) worst = std::max(worst, (t - b.at(name)).abs().max().item<double>());
  return worst;
}

TEST(LossVariants, PerTokenLossDividesByTheGlobalTokenCount) {
  const Config per_token = build(mock_args({"--calculate-per-token-loss"}));
  const Config mean = build(mock_args({}));
  ASSERT_EQ(per_token.data.pad, 5);
  const TrainOptions weights{.collect_final_weights = true};
  const auto trained_per_token = train(per_token, weights).final_weights;
  const auto trained_mean = train(mean, weights).final_weights;
  EXPECT_LT(max_difference(trained_per_token, expected_weights(per_token, true)), 1e-5);
  EXPECT_LT(max_difference(trained_mean, expected_weights(mean, false)), 1e-5);
  EXPECT_GT(max_difference(trained_per_token, trained_mean), 1e-4) << "the two normalisations should differ here";
}

// --rampup-batch-size 2 2 6 with --global-batch-size 6: batches 2 (consumed 0..2), 4 (3..6),
// then 6; Megatron's update_train_iters walks the same schedule.
TEST(LossVariants, BatchRampupSchedule) {
  BatchSchedule s(6, 2, BatchRampup{2, 2, 6});
  EXPECT_EQ(s.global_batch(0), 2);
  EXPECT_EQ(s.global_batch(2), 2);   // 2 / (6 / 2 increments) = 0.67 -> 0 steps
  EXPECT_EQ(s.global_batch(3), 4);
  EXPECT_EQ(s.global_batch(6), 6);   // 6 / 3 = 2 steps
  EXPECT_EQ(s.global_batch(7), 6);   // past the ramp-up
  EXPECT_EQ(s.micro_batches(3), 2);
  // update_train_iters: while consumed <= 6 add the batch: +2 (2), +2 (4), +4 (8): 3 iterations,
  // then (30 - 8) / 6 = 3 whole batches.
  EXPECT_EQ(s.train_iters(30), 6);
  BatchSchedule rounding(7, 2, BatchRampup{3, 2, 4}, /*decrease_if_needed=*/true);
  EXPECT_EQ(rounding.global_batch(0), 3);
  EXPECT_EQ(rounding.running_batch(0), 2);
  EXPECT_EQ(rounding.running_batches(), (std::vector<int64_t>{2, 4, 6}));
  EXPECT_USER_ERROR(BatchSchedule(6, 2, BatchRampup{2, 3, 6}), "not divisible by the increment");
  // Through the trainer: 4 + 4 + 8 + 8 samples in 4 iterations (batches 4, 4, 8, 8 with 8 ramp-up samples).
  auto args = tiny_args({"--train-samples", "24", "--global-batch-size", "8", "--rampup-batch-size", "4", "4", "8",
                         "--eval-iters", "0", "--log-interval", "1"});
  args.erase(std::find(args.begin(), args.end(), "--train-iters"), std::find(args.begin(), args.end(), "--train-iters") + 2);
  const Config c = build(args);
  EXPECT_EQ(c.training.train_iters, 4);
  TrainResult r = train(c);
  EXPECT_EQ(r.consumed_samples, 4 + 4 + 8 + 8);
}

// --step-batch-size-schedule "0:4 0.128K:8" over --seq-length 16: batch 4 below 8 consumed
// samples, then 8: 4 + 4 + 8 + 8 = 24 samples in 4 iterations. A falling batch stops training
// with Megatron's message when it applies.
TEST(LossVariants, StepBatchSizeScheduleThroughTheTrainer) {
  auto run_args = [](const std::string& schedule, const std::string& samples) {
    auto args = tiny_args({"--train-samples", samples, "--step-batch-size-schedule", schedule, "--eval-iters", "0",
                           "--log-interval", "1"});
    args.erase(std::find(args.begin(), args.end(), "--train-iters"), std::find(args.begin(), args.end(), "--train-iters") + 2);
    return args;
  };
  const Config c = build(run_args("0:4 0.128K:8", "24"));
  ASSERT_EQ(c.model.seq_length, 16);
  EXPECT_EQ(c.training.train_iters, 4);
  EXPECT_EQ(train(c).consumed_samples, 4 + 4 + 8 + 8);
  EXPECT_USER_ERROR(train(build(run_args("0:8 0.128K:4", "16"))), "Number of microbatches should not decrease; going from 4 to 2");
  // Early entries are checked when they apply: 3 is not a multiple of micro-batch 2.
  EXPECT_USER_ERROR(train(build(run_args("0:3 0.128K:8", "16"))), "current global batch size (3) is not divisible");
}

// torch.randperm(12, generator seeded 0) = [8, 0, 5, 9, 7, 4, 2, 10, 3, 1, 11, 6] and seeded 1 =
// [1, 4, 6, 8, 11, 0, 5, 3, 2, 9, 10, 7] (PyTorch 2.11); 26 samples, micro-batch 2, data-parallel
// 2: active 24, buckets of 12 per rank.
TEST(LossVariants, CyclicSamplerOrderMatchesMegatron) {
  struct Identity : SampleSource {
    void sample(Split, int64_t index, int64_t* out) const override { out[0] = index; }
  };
  auto inner = std::make_shared<Identity>();
  CyclicSource sharded(inner, {26, 0, 0}, 2, 2, true);
  // Logical index = consumed + rank x mbs + j: rank 0 reads bucket [0, 12), rank 1 [12, 24).
  EXPECT_EQ(sharded.dataset_index(Split::Train, 0), 8);        // consumed 0, rank 0, perm[0]
  EXPECT_EQ(sharded.dataset_index(Split::Train, 1), 0);        // perm[1]
  EXPECT_EQ(sharded.dataset_index(Split::Train, 2), 12 + 8);   // rank 1
  EXPECT_EQ(sharded.dataset_index(Split::Train, 5), 9);        // consumed 4, rank 0, j 1: perm[4 / 2 + 1]
  EXPECT_EQ(sharded.dataset_index(Split::Train, 24), 1);       // epoch 1: perm seeded 1
  CyclicSource unsharded(inner, {26, 0, 0}, 2, 2, false);
  // One permutation of 26 / 2 x 2 = 26; rank r takes every 2nd from pos + r.
  auto g = at::make_generator<at::CPUGeneratorImpl>(0);
  auto perm = torch::randperm(26, g, torch::kInt64);
  EXPECT_EQ(unsharded.dataset_index(Split::Train, 0), perm[0].item<int64_t>());
  EXPECT_EQ(unsharded.dataset_index(Split::Train, 1), perm[2].item<int64_t>());  // j = 1: pos + j x dp + r
  EXPECT_EQ(unsharded.dataset_index(Split::Train, 2), perm[1].item<int64_t>());  // rank 1
}

TEST(LossVariants, NoAttentionMaskInTheDataLoader) {
  std::shared_ptr<SampleSource> source = make_mock_source(16, 16, 15, 0);
  BatchOptions o;
  o.seq_length = 16;
  o.micro_batch_size = 2;
  o.eod = 15;
  o.reset_attention_mask = o.reset_position_ids = true;
  o.prefetch = 0;
  BatchLoader with(source, Split::Train, o, torch::kCPU);
  EXPECT_TRUE(with.load(0).segment_ids.defined());
  o.create_attention_mask = false;
  BatchLoader without(source, Split::Train, o, torch::kCPU);
  Batch b = without.load(0);
  EXPECT_FALSE(b.segment_ids.defined());      // plain causal attention
  EXPECT_TRUE(b.position_ids.defined());      // positions still restart
}

}  // namespace fp8tron
