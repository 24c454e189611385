// The metadata JSON: exact round trip of every field (binary state bit for bit), and one clear
// error per kind of bad file.
#include "checkpoint/metadata.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/checkpoint/temp_dir.h"

namespace fp8tron::checkpoint {
namespace {

using testing::slurp;
using testing::spit;
using testing::TempDir;

CheckpointMetadata sample() {
  CheckpointMetadata m;
  m.iteration = 1200;
  m.consumed_train_samples = 1200 * 512;
  m.consumed_valid_samples = 4096;
  m.floating_point_operations_so_far = 1.2345678901234567e18;
  m.data_loader = {{"train_sample_index", 614400}, {"epoch", 1}};
  m.parallel = {2, 2, 2, 1, 1, 1, 8};
  m.args = {{"num_layers", "24"}, {"lr", "0.00015"}, {"data_path", "/data/\u00e9t\u00e9 \"q\""}};
  m.lr_scheduler_num_steps = 614400;
  m.loss_scaler = {65536.0 * 3.0 / 7.0, 17, 2};
  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes += char(i);
  m.rng = {{0, "cpu", all_bytes}, {0, "cuda", std::string("\0\1\2", 3)}, {7, "cpu", ""}};
  float nan = std::numeric_limits<float>::quiet_NaN();
  float inf = std::numeric_limits<float>::infinity();
  m.fp8 = {{"decoder.layers.0.linear_fc1.amax_history", {1.5f, 0.0f, -0.0f, inf, 1e-40f}},
           {"decoder.layers.0.linear_fc1.scale", {448.0f, nan}},
           {"empty", {}}};
  TensorEntry w;
  w.dtype = DType::BF16;
  w.shape = {8, 4};
  w.shards = {{"rank_00000.safetensors", "w", {0, 0}, {4, 4}, 0, 2},
              {"rank_00001.safetensors", "w", {4, 0}, {4, 4}, 0, 2}};
  TensorEntry s;
  s.dtype = DType::F32;
  s.shape = {};
  s.shards = {{"rank_00000.safetensors", "step", {}, {}, 0, 8}};
  m.tensors = {{"decoder.weight", w}, {"optimizer.step", s}};
  return m;
}

// Bitwise, since NaN != NaN.
bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  return "";
}

// The sample's JSON with one edit applied.
std::string edited(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(serialize_metadata(sample()));
  edit(j);
  return j.dump();
}

TEST(Base64, Rfc4648Vectors) {
  const std::pair<const char*, const char*> v[] = {{"", ""},         {"f", "Zg=="},       {"fo", "Zm8="},
                                                   {"foo", "Zm9v"},   {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
                                                   {"foobar", "Zm9vYmFy"}};
  for (auto [plain, enc] : v) {
    EXPECT_EQ(base64_encode(plain), enc);
    std::string back;
    ASSERT_TRUE(base64_decode(enc, back));
    EXPECT_EQ(back, plain);
  }
  std::string out;
  for (const char* bad : {"Zg=", "Zg", "Z===", "Zm9v!", "Zh==", "Zm9=", "=Zm9"}) EXPECT_FALSE(base64_decode(bad, out)) << bad;
}

TEST(Metadata, RoundTripIsExact) {
  CheckpointMetadata m = sample();
  std::string text = serialize_metadata(m);
  CheckpointMetadata back = parse_metadata(text, "meta.json");
  EXPECT_EQ(back.iteration, m.iteration);
  EXPECT_EQ(back.consumed_train_samples, m.consumed_train_samples);
  EXPECT_EQ(back.consumed_valid_samples, m.consumed_valid_samples);
  EXPECT_EQ(back.floating_point_operations_so_far, m.floating_point_operations_so_far);
  EXPECT_EQ(back.data_loader, m.data_loader);
  EXPECT_EQ(back.parallel, m.parallel);
  EXPECT_EQ(back.args, m.args);
  EXPECT_EQ(back.lr_scheduler_num_steps, m.lr_scheduler_num_steps);
  EXPECT_EQ(back.loss_scaler, m.loss_scaler);  // doubles round-trip exactly
  EXPECT_EQ(back.rng, m.rng);
  ASSERT_EQ(back.fp8.size(), m.fp8.size());
  for (const auto& [k, v] : m.fp8) EXPECT_TRUE(same_floats(back.fp8.at(k), v)) << k;
  EXPECT_EQ(back.tensors, m.tensors);
  EXPECT_EQ(serialize_metadata(back), text);  // stable
  // Human-readable where it can be.
  EXPECT_NE(text.find("\"format\": \"fp8tron-checkpoint\""), std::string::npos);
  EXPECT_NE(text.find("\"iteration\": 1200"), std::string::npos);
}

TEST(Metadata, FileRoundTrip) {
  TempDir dir;
  write_metadata(dir.path(), sample());
  CheckpointMetadata back = read_metadata(dir.path());
  EXPECT_EQ(back.tensors, sample().tensors);
  std::string msg = error_of([&] { read_metadata(dir / "nothing"); });
  EXPECT_NE(msg.find("fp8tron_checkpoint.json is missing"), std::string::npos) << msg;
  spit(dir / kMetadataFileName, slurp(dir / kMetadataFileName).substr(0, 200));
  msg = error_of([&] { read_metadata(dir.path()); });
  EXPECT_NE(msg.find(dir / kMetadataFileName), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupt or truncated"), std::string::npos) << msg;
}

TEST(Metadata, VersionErrors) {
  std::string msg = error_of([] { parse_metadata(edited([](auto& j) { j["format_version"] = 2; }), "m.json"); });
  EXPECT_NE(msg.find("m.json: format version 2 is newer than this fp8tron reads (1); upgrade fp8tron"),
            std::string::npos) << msg;
  msg = error_of([] { parse_metadata(edited([](auto& j) { j["format_version"] = 0; }), "m.json"); });
  EXPECT_NE(msg.find("unknown format version 0"), std::string::npos) << msg;
  msg = error_of([] { parse_metadata(edited([](auto& j) { j["format"] = "megatron"; }), "m.json"); });
  EXPECT_NE(msg.find("not an fp8tron checkpoint metadata file"), std::string::npos) << msg;
  msg = error_of([] { parse_metadata("[1,2]", "m.json"); });
  EXPECT_NE(msg.find("not a JSON object"), std::string::npos) << msg;
  msg = error_of([] { parse_metadata("{\"format\": ", "m.json"); });
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
}

TEST(Metadata, MissingAndMistypedFields) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    const char* message;
  };
  const Case cases[] = {
      {[](auto& j) { j.erase("iteration"); }, "missing field 'iteration'"},
      {[](auto& j) { j["parallel"].erase("tp"); }, "missing field 'parallel.tp'"},
      {[](auto& j) { j["loss_scaler"].erase("scale"); }, "missing field 'loss_scaler.scale'"},
      {[](auto& j) { j.erase("tensors"); }, "missing field 'tensors'"},
      {[](auto& j) { j["tensors"]["decoder.weight"]["shards"][0].erase("file"); },
       "missing field 'tensors.decoder.weight.shards[0].file'"},
      {[](auto& j) { j["iteration"] = "12"; }, "field 'iteration' must be an integer, not \"12\""},
      {[](auto& j) { j["iteration"] = 1.5; }, "field 'iteration' must be an integer"},
      {[](auto& j) { j["release"] = 1; }, "field 'release' must be true or false"},
      {[](auto& j) { j["args"]["lr"] = 0.1; }, "field 'args.lr' must be a string"},
      {[](auto& j) { j["data_loader"]["epoch"] = "x"; }, "field 'data_loader.epoch' must be an integer"},
      {[](auto& j) { j["rng"][0]["state"] = "not base64!"; }, "field 'rng[0].state' is not valid base64"},
      {[](auto& j) { j["fp8"]["empty"] = "AAA="; }, "not a whole number of float32 values"},
      {[](auto& j) { j["tensors"]["decoder.weight"]["dtype"] = "F12"; }, "'tensors.decoder.weight.dtype' is 'F12'"},
      {[](auto& j) { j["parallel"]["world_size"] = 6; }, "world size 6 is not tp*pp*dp*cp"},
      {[](auto& j) { j["parallel"]["vpp"] = 0; }, "parallel sizes must be >= 1"},
      {[](auto& j) { j["loss_scaler"]["scale"] = -1.0; }, "loss scale -1 must be finite and positive"},
      {[](auto& j) { j["iteration"] = -3; }, "must be >= 0"},
      {[](auto& j) { j["rng"][2]["rank"] = 8; }, "RNG state 'cpu' is for rank 8, outside world size 8"},
      {[](auto& j) { j["rng"][1]["name"] = "cpu"; }, "RNG state 'cpu' of rank 0 appears twice"},
      {[](auto& j) { j["tensors"]["decoder.weight"]["shards"][0]["file"] = "../x"; }, "shard files are plain names"},
      {[](auto& j) { j["tensors"]["decoder.weight"]["shards"][0]["key"] = ""; }, "empty key"},
      {[](auto& j) { j["tensors"]["decoder.weight"]["shards"].erase(1); },
       "tensor 'decoder.weight': region [4:8, 0:4] of the needed [0:8, 0:4] is in no saved shard"},
      {[](auto& j) { j["tensors"]["decoder.weight"]["shards"][1]["offset"] = {2, 0}; }, "overlap in [2:4, 0:4]"},
      {[](auto& j) { j["tensors"]["decoder.weight"]["shards"][1]["offset"] = {5, 0}; }, "lies outside the tensor's shape"},
      {[](auto& j) { j["tensors"]["decoder.weight"]["shards"][1]["shape"] = {4}; }, "offset [4, 0] and shape [4], which do not both have the tensor's 2 dims"},
  };
  for (const auto& c : cases) {
    std::string msg = error_of([&] { parse_metadata(edited(c.edit), "ckpt/m.json"); });
    EXPECT_EQ(msg.rfind("ckpt/m.json: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.message), std::string::npos) << "expected '" << c.message << "' in: " << msg;
  }
}

TEST(Metadata, SerializeValidatesToo) {
  CheckpointMetadata m = sample();
  m.parallel.world_size = 3;
  EXPECT_THROW(serialize_metadata(m), UserError);
  m = sample();
  m.args["bad"] = "\xff";
  EXPECT_THROW(serialize_metadata(m), UserError);
}

TEST(TensorTable, ReplicasAndMerging) {
  // Every holder registers its box in rank order; only the first stores it.
  TensorTable table;
  ShardEntry s{"rank_00000.safetensors", "ln.weight", {0}, {16}, 0, 1};
  EXPECT_TRUE(add_shard(table, "ln.weight", DType::F32, {16}, s));
  for (int r = 1; r < 4; ++r) {
    ShardEntry replica = s;
    replica.file = "rank_0000" + std::to_string(r) + ".safetensors";
    EXPECT_FALSE(add_shard(table, "ln.weight", DType::F32, {16}, replica));
  }
  ASSERT_EQ(table["ln.weight"].shards.size(), 1u);
  EXPECT_EQ(table["ln.weight"].shards[0].replicas, 4);
  EXPECT_EQ(table["ln.weight"].shards[0].file, "rank_00000.safetensors");

  // Per-rank tables merged on the committing rank, through their string form.
  TensorTable r0, r1;
  add_shard(r0, "w", DType::BF16, {4, 6}, {"rank_00000.safetensors", "w", {0, 0}, {4, 3}, 0, 1});
  add_shard(r1, "w", DType::BF16, {4, 6}, {"rank_00001.safetensors", "w", {0, 3}, {4, 3}, 0, 1});
  add_shard(r1, "b", DType::F32, {6}, {"rank_00001.safetensors", "b", {0}, {6}, 0, 2});
  TensorTable merged = parse_tensor_table(serialize_tensor_table(r0), "rank 0");
  merge_tensor_tables(merged, parse_tensor_table(serialize_tensor_table(r1), "rank 1"));
  EXPECT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged["w"].shards.size(), 2u);
  CheckpointMetadata m;
  m.tensors = merged;
  EXPECT_NO_THROW(parse_metadata(serialize_metadata(m), "x"));

  std::string msg = error_of([&] {
    add_shard(merged, "w", DType::F32, {4, 6}, {"rank_00002.safetensors", "w", {0, 0}, {4, 3}, 0, 1});
  });
  EXPECT_NE(msg.find("tensor 'w' is saved as BF16 [4, 6] by one rank and F32 [4, 6] by another"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fp8tron::checkpoint
