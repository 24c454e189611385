#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "core/error.h"
#include "tests/test_helpers.h"

namespace fp8tron {
using namespace fp8tron::testing;

TEST(FlagTable, NamesAreUniqueAndWellFormed) {
  std::set<std::string> seen;
  for (const auto& f : flag_table()) {
    EXPECT_TRUE(seen.insert(f.name).second) << "duplicate flag " << f.name;
    EXPECT_NE(std::string(f.name).rfind("-", 0), 0u) << f.name << " must be stored without leading dashes";
    if (f.support != Support::Yes) EXPECT_STRNE(f.note, "") << f.name << " needs a note saying why";
  }
  EXPECT_GT(flag_table().size(), 500u) << "the table should know every Megatron flag";
}

TEST(FlagTable, CoreMegatronFlagsAreImplemented) {
  for (const char* name : {"num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "kv-channels",
                           "group-query-attention", "num-query-groups", "seq-length", "max-position-embeddings",
                           "position-embedding-type", "rotary-base", "rotary-percent", "normalization", "norm-epsilon",
                           "apply-layernorm-1p", "swiglu", "disable-bias-linear", "untie-embeddings-and-output-weights",
                           "init-method-std", "attention-dropout", "hidden-dropout", "vocab-size",
                           "make-vocab-size-divisible-by", "qk-layernorm", "micro-batch-size", "global-batch-size",
                           "train-iters", "train-samples", "lr", "min-lr", "lr-decay-style", "lr-decay-iters",
                           "lr-decay-samples", "lr-warmup-iters", "lr-warmup-fraction", "lr-warmup-samples",
                           "weight-decay", "clip-grad", "adam-beta1", "adam-beta2", "adam-eps", "optimizer", "seed",
                           "bf16", "fp16", "loss-scale", "initial-loss-scale", "min-loss-scale", "loss-scale-window",
                           "hysteresis", "attention-softmax-in-fp32", "accumulate-allreduce-grads-in-fp32",
                           "exit-interval", "exit-duration-in-mins", "eval-interval", "eval-iters", "log-interval",
                           "log-throughput", "timing-log-level", "tensorboard-dir", "mock-data", "config", "dry-run",
                           "device"}) {
    const FlagSpec* f = find_flag(name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_EQ(f->support, Support::Yes) << name;
  }
}

TEST(Flags, ParsesKindsAndDefaults) {
  FlagValues v = parse({"--num-layers", "12", "--lr=3e-4", "--bf16", "--data-path", "0.3", "a", "0.7", "b"});
  EXPECT_EQ(v.get_int("num-layers"), 12);
  EXPECT_DOUBLE_EQ(v.get_float("lr"), 3e-4);
  EXPECT_TRUE(v.get_bool("bf16"));
  EXPECT_FALSE(v.get_bool("fp16"));
  EXPECT_EQ(v.get_list("data-path"), (std::vector<std::string>{"0.3", "a", "0.7", "b"}));
  EXPECT_DOUBLE_EQ(v.get_float("init-method-std"), 0.02);        // Megatron default
  EXPECT_EQ(v.get_string("position-embedding-type"), "learned_absolute");
  EXPECT_FALSE(v.opt_int("ffn-hidden-size").has_value());       // None
  EXPECT_USER_ERROR(v.get_int("hidden-size"), "missing required flag --hidden-size");
}

TEST(Flags, LastValueWins) {
  EXPECT_EQ(parse({"--num-layers", "2", "--num-layers", "4"}).get_int("num-layers"), 4);
}

TEST(Flags, UnknownFlagSuggestsClosestName) {
  EXPECT_USER_ERROR(parse({"--num-layer", "2"}), "did you mean '--num-layers'?");
  EXPECT_USER_ERROR(parse({"--hiden-size", "2"}), "did you mean '--hidden-size'?");
  EXPECT_USER_ERROR(parse({"--micro_batch_size", "2"}), "did you mean '--micro-batch-size'?");
  EXPECT_USER_ERROR(parse({"--completely-unrelated-thing"}), "unknown flag '--completely-unrelated-thing'");
}

TEST(Flags, BadValues) {
  EXPECT_USER_ERROR(parse({"--num-layers", "two"}), "--num-layers expects an integer, got 'two'");
  EXPECT_USER_ERROR(parse({"--lr", "fast"}), "--lr expects a number");
  EXPECT_USER_ERROR(parse({"--normalization", "rmsnorm"}), "did you mean 'RMSNorm'?");
  EXPECT_USER_ERROR(parse({"--lr-decay-style", "exp"}), "invalid choice 'exp'");
  EXPECT_USER_ERROR(parse({"--num-layers"}), "command line");
  EXPECT_USER_ERROR(parse({"stray"}), "unexpected argument 'stray'");
  EXPECT_USER_ERROR(parse({"--lr", "nan"}), "--lr expects a finite number, got 'nan'");
  EXPECT_USER_ERROR(parse({"--clip-grad", "inf"}), "--clip-grad expects a finite number");
  EXPECT_USER_ERROR(parse({"--save", ""}), "--save was given an empty value");
}

// Megatron's parser refuses a second value after a single-valued flag; keeping the last one would
// train a model nobody asked for.
TEST(Flags, ExtraValueAfterAFlagIsRefused) {
  EXPECT_USER_ERROR(parse({"--num-layers", "2", "3"}), "--num-layers takes one value, but '2' is followed by '3'");
  EXPECT_USER_ERROR(parse({"--lr", "1e-3", "5e-4", "--bf16"}), "--lr takes one value");
  EXPECT_EQ(parse({"--init-method-std", "-1", "--lr", "1"}).get_float("init-method-std"), -1.0);
  EXPECT_EQ(parse({"--data-path", "0.3", "a", "0.7", "b"}).get_list("data-path").size(), 4u);
  EXPECT_EQ(parse({"--lr=1e-3", "--num-layers", "2"}).get_int("num-layers"), 2);
}

// A single-valued flag keeps a bracketed value whole (CLI11 alone would split it as a list).
TEST(Flags, BracketedValueOfASingleValuedFlagStaysWhole) {
  EXPECT_EQ(parse({"--moe-layer-freq", "[1,0,1]"}).get_string("moe-layer-freq"), "[1,0,1]");
  EXPECT_EQ(parse({"--moe-layer-freq=[0,1]", "--num-layers", "2"}).get_string("moe-layer-freq"), "[0,1]");
  EXPECT_EQ(parse({"--data-path", "0.3", "a", "0.7", "b"}).get_list("data-path").size(), 4u);
  const Config c = build(tiny_args({"--num-layers", "3", "--num-experts", "4", "--moe-ffn-hidden-size", "32",
                                    "--moe-layer-freq", "[1,0,1]"}));
  EXPECT_TRUE(c.model.moe.is_moe_layer(0));
  EXPECT_FALSE(c.model.moe.is_moe_layer(1));
  EXPECT_TRUE(c.model.moe.is_moe_layer(2));
}

TEST(Flags, JsonConfigMergesAndCommandLineWins) {
  std::string path = temp_file("config.json", R"({"num_layers": 6, "hidden-size": 128, "bf16": true, "fp16": false,
      "data-path": ["1.0", "x"], "lr": 0.001, "ffn-hidden-size": null})");
  FlagValues v = parse({"--config", path, "--num-layers", "3"});
  EXPECT_EQ(v.get_int("num-layers"), 3);  // command line wins
  EXPECT_EQ(v.get_int("hidden-size"), 128);
  EXPECT_TRUE(v.get_bool("bf16"));
  EXPECT_FALSE(v.get_bool("fp16"));
  EXPECT_DOUBLE_EQ(v.get_float("lr"), 0.001);
  EXPECT_EQ(v.get_list("data-path").size(), 2u);
  EXPECT_FALSE(v.opt_int("ffn-hidden-size").has_value());
}

TEST(Flags, JsonConfigErrors) {
  EXPECT_USER_ERROR(parse({"--config", "/nonexistent/x.json"}), "cannot open");
  EXPECT_USER_ERROR(parse({"--config", std::filesystem::temp_directory_path().string()}), "is a directory");
  EXPECT_USER_ERROR(parse({"--config", temp_file("bad.json", "{not json")}), "not valid JSON");
  EXPECT_USER_ERROR(parse({"--config", temp_file("arr.json", "[1,2]")}), "must be a JSON object");
  EXPECT_USER_ERROR(parse({"--config", temp_file("unk.json", R"({"num-layerz": 2})")}), "did you mean '--num-layers'?");
  EXPECT_USER_ERROR(parse({"--config", temp_file("type.json", R"({"num-layers": "many"})")}),
                    "--num-layers expects an integer");
  EXPECT_USER_ERROR(parse({"--config", temp_file("bool.json", R"({"bf16": 1})")}), "must be true or false");
  EXPECT_USER_ERROR(parse({"--config", temp_file("list.json", R"({"num-layers": [1, 2]})")}), "takes one value");
}

TEST(Flags, UsageListsImplementedFlags) {
  std::string usage = usage_text();
  EXPECT_NE(usage.find("--num-layers"), std::string::npos);
  EXPECT_NE(usage.find("--dry-run"), std::string::npos);
}

}  // namespace fp8tron
