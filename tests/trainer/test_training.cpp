#include <gtest/gtest.h>

#include <ATen/Context.h>

#include <cmath>

#include "data/loader/builtin_datasets.h"
#include "tests/test_helpers.h"
#include "trainer/trainer.h"

namespace fp8tron {
using namespace fp8tron::testing;

std::vector<std::string> training_args(const std::vector<std::string>& extra) {
  auto args = tiny_args({"--hidden-size", "64", "--seq-length", "32", "--micro-batch-size", "8", "--global-batch-size", "16",
                         "--vocab-size", "128", "--lr", "3e-3", "--attention-dropout", "0", "--hidden-dropout", "0",
                         "--log-interval", "1000", "--eval-iters", "0"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

Config training_config(std::initializer_list<std::string> extra) { return build(training_args(extra)); }

double mean(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / double(to - from);
}

TEST(Training, TinyModelLossFalls) {
  TrainResult r = train(training_config({"--train-iters", "80", "--lr-warmup-iters", "5", "--lr-decay-style", "cosine"}));
  ASSERT_EQ(r.losses.size(), 80u);
  EXPECT_NEAR(r.losses.front(), std::log(256.0), 0.6);  // starts near ln(padded vocab)
  EXPECT_LT(mean(r.losses, 70, 80), std::log(129.0) / 2) << "loss should fall far below ln(vocab)";
  EXPECT_EQ(r.consumed_samples, 80 * 16);
}

TEST(Training, SameSeedGivesIdenticalLosses) {
  auto config = training_config({"--train-iters", "8", "--hidden-dropout", "0.1", "--attention-dropout", "0.1"});
  const TrainOptions weights{.collect_final_weights = true};
  TrainResult a = train(config, weights), b = train(config, weights);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.final_weights_sample, b.final_weights_sample);
  TrainResult c = train(training_config({"--train-iters", "8", "--seed", "99"}));
  EXPECT_NE(a.losses, c.losses);
}

TEST(Training, DeterministicModeOnTheCpuRepeatsAndChangesNothing) {
  // The CPU kernels are deterministic already: the mode must not change a single bit (e.g. by
  // exposing a read of uninitialized memory, which torch's deterministic mode fills with NaN).
  const TrainOptions weights{.collect_final_weights = true};
  for (const char* precision : {"--fp16", "--bf16"}) {
    std::vector<std::string> flags = {"--train-iters", "6", "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
                                      "--swiglu", precision};
    TrainResult reference = train(build(training_args(flags)), weights);
    flags.push_back("--deterministic-mode");
    const Config deterministic = build(training_args(flags));
    ASSERT_TRUE(deterministic.training.deterministic);
    TrainResult a = train(deterministic, weights), b = train(deterministic, weights);
    EXPECT_EQ(a.losses, reference.losses) << precision;
    EXPECT_EQ(a.losses, b.losses) << precision;
    EXPECT_EQ(a.final_weights_sample, reference.final_weights_sample) << precision;
    EXPECT_EQ(a.final_weights_sample, b.final_weights_sample) << precision;
    EXPECT_FALSE(at::globalContext().deterministicAlgorithms()) << "torch's switch is restored after the run";
  }
}

TEST(Training, Bf16LossFalls) {
  TrainResult r = train(training_config({"--train-iters", "60", "--bf16", "--swiglu", "--normalization", "RMSNorm",
                                         "--position-embedding-type", "rope", "--disable-bias-linear"}));
  EXPECT_LT(mean(r.losses, 50, 60), mean(r.losses, 0, 5) - 1.0);
}

TEST(Training, GradReduceInBf16IsTheBf16GradientBuffer) {
  // --grad-reduce-in-bf16 keeps the gradients in bf16: bitwise the precision-aware optimizer's
  // --main-grads-dtype bf16 (with fp32 moments, the default Adam), and not the fp32 accumulation.
  const std::vector<std::string> bf16 = {"--train-iters", "6", "--bf16", "--global-batch-size", "32"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), bf16.begin(), bf16.end());
    return train(build(training_args(extra))).losses;
  };
  const auto reduce_in_bf16 = with({"--grad-reduce-in-bf16"});
  EXPECT_EQ(reduce_in_bf16, with({"--use-distributed-optimizer", "--use-precision-aware-optimizer", "--main-grads-dtype",
                                  "bf16"}));
  EXPECT_NE(reduce_in_bf16, with({}));
}

TEST(Training, Fp16DynamicLossScaleSkipsOverflowsAndRecovers) {
  // 2^32 overflows fp16 at first: the scaler backs off, skipped steps leave weights alone.
  TrainResult r = train(training_config({"--train-iters", "60", "--fp16", "--lr", "3e-3"}));
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(mean(r.losses, 50, 60), mean(r.losses, 0, 5) - 0.5);
}

TEST(Training, SgdAndMockDataTrain) {
  TrainResult r = train(training_config({"--train-iters", "40", "--optimizer", "sgd", "--lr", "0.3"}));
  EXPECT_LT(mean(r.losses, 35, 40), mean(r.losses, 0, 5));
  auto args = tiny_args({"--train-iters", "30", "--seq-length", "64", "--micro-batch-size", "4", "--vocab-size", "512",
                         "--log-interval", "1000", "--eval-iters", "2", "--eval-interval", "10"});
  args.erase(std::find(args.begin(), args.end(), "--builtin-data"));
  args.push_back("--mock-data");
  TrainResult m = train(build(args));
  EXPECT_LT(mean(m.losses, 25, 30), mean(m.losses, 0, 3));
  EXPECT_TRUE(std::isfinite(m.last_validation_loss));
}

TEST(Training, ExitIntervalStopsEarly) {
  TrainResult r = train(training_config({"--train-iters", "20", "--exit-interval", "7"}));
  EXPECT_EQ(r.iterations, 7);
  EXPECT_EQ(r.losses.size(), 7u);
}

TEST(Training, RefusesFeaturesThatHaveNotLanded) {
  EXPECT_USER_ERROR(train(training_config({"--train-iters", "2", "--optimizer-cpu-offload"})),
                    "not supported yet: --optimizer-cpu-offload");
}

TEST(BuiltinData, DeterministicPerIndexAndSplit) {
  auto source = make_builtin_source(32, 129, 1234);
  std::vector<int64_t> a(33), b(33), c(33);
  source->sample(Split::Train, 5, a.data());
  source->sample(Split::Train, 5, b.data());
  source->sample(Split::Valid, 5, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (int64_t t : a) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 129);
  }
  EXPECT_NEAR(builtin_source_entropy(), 1.11, 0.01);
}

TEST(MockData, SamplesAreMegatrons) {
  // Sample 2 of Megatron's mock train split for --seed 1234, --seq-length 64 and 1024 ids: the end
  // of a document (its last id, then the end-of-document 1023) and the next document's start.
  auto source = make_mock_source(64, 1024, 1023, 1234);
  std::vector<int64_t> s(65);
  source->sample(Split::Train, 2, s.data());
  std::vector<int64_t> expected;
  for (int64_t t = 907; t <= 962; ++t) expected.push_back(t);
  expected.push_back(1023);
  for (int64_t t = 1; t <= 8; ++t) expected.push_back(t);
  EXPECT_EQ(s, expected);
}

}  // namespace fp8tron
