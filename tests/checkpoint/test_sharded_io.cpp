// End to end without torch: a (TP, DP) = (2, 2) job saves a toy GPT layer — tensor-parallel
// weights, a replicated layernorm and distributed-optimizer flat shards — through the atomic
// commit; it then loads into TP 1, TP 4 and arbitrary boxes, and bad checkpoints fail clearly.
#include "checkpoint/sharded_io.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "tests/checkpoint/temp_dir.h"
#include "tests/checkpoint/error_text.h"

namespace fp8tron::checkpoint {
namespace {

using testing::error_of;

namespace fs = std::filesystem;
using testing::slurp;
using testing::spit;
using testing::TempDir;
using Dims = std::vector<int64_t>;

struct Param {
  std::string name;
  Shape shape;
  int split_dim;  // -1: replicated across TP
};

const std::vector<Param> kParams = {
    {"embedding.word_embeddings.weight", {16, 8}, 0},
    {"decoder.layers.0.self_attention.linear_qkv.weight", {12, 8}, 0},
    {"decoder.layers.0.self_attention.linear_proj.weight", {8, 12}, 1},
    {"decoder.layers.0.input_layernorm.weight", {8}, -1},
};

// Global values: distinct per tensor and element.
std::vector<float> global_values(size_t param, bool optimizer) {
  const Shape& s = kParams[param].shape;
  int64_t n = *checked_numel(s);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(param * 1000 + i) + (optimizer ? 0.25f : 0.0f);
  return v;
}

std::vector<float> extract(const std::vector<float>& global, const Shape& gshape, const Box& box) {
  std::vector<float> out(size_t(box_volume(box)));
  copy_box(global.data(), gshape, box.offset, out.data(), box.shape, Dims(box.shape.size(), 0), box.shape,
           sizeof(float));
  return out;
}
Box tp_box(const Param& p, int tp_rank, int tp) {
  return p.split_dim < 0 ? whole(p.shape) : split_box(p.shape, size_t(p.split_dim), tp_rank, tp);
}

// Saves the toy model as a (tp, dp) job would: every rank writes its file into the temporary
// directory, rank 0 merges the tables, writes the metadata and commits.
void save_toy(const std::string& save_dir, int64_t iteration, int tp, int dp) {
  const int world = tp * dp;
  SaveTarget target{save_dir, iteration, false, "job42"};
  std::vector<std::string> tables;
  // Buffers must outlive write(): keep them per rank.
  for (int rank = 0; rank < world; ++rank) {
    const int tp_rank = rank % tp, dp_rank = rank / tp;  // Megatron order: tp fastest
    std::string tmp = begin_save(target);
    RankShardWriter writer(rank_file_name(rank));
    std::vector<std::vector<float>> keep;
    for (size_t i = 0; i < kParams.size(); ++i) {
      const Param& p = kParams[i];
      Box box = tp_box(p, tp_rank, tp);
      // Model weights: DP rank 0 stores; a TP-replicated one only on TP rank 0 as well.
      bool stores = dp_rank == 0 && (p.split_dim >= 0 || tp_rank == 0);
      if (stores) {
        keep.push_back(extract(global_values(i, false), p.shape, box));
        writer.add(p.name, DType::F32, p.shape, box, keep.back().data(),
                   p.split_dim >= 0 ? dp : dp * tp);
      }
      // Distributed optimizer: the TP shard flattened and split over DP ranks (uneven).
      if (p.split_dim >= 0 || tp_rank == 0) {
        int64_t n = box_volume(box), per = (n + dp - 1) / dp;
        int64_t b = std::min(n, dp_rank * per), e = std::min(n, b + per);
        auto local = extract(global_values(i, true), p.shape, box);
        keep.emplace_back(local.begin() + b, local.begin() + e);
        if (e > b) writer.add_flat_range("optimizer.exp_avg." + p.name, DType::F32, p.shape, box, b, e, keep.back().data());
      }
    }
    WriteOptions fast;
    fast.fsync = false;
    writer.write(tmp, fast);
    tables.push_back(serialize_tensor_table(writer.table()));
  }
  // Committing rank.
  CheckpointMetadata m;
  m.iteration = iteration;
  m.parallel.tp = tp;
  m.parallel.dp = dp;
  m.parallel.world_size = world;
  for (size_t r = 0; r < tables.size(); ++r)
    merge_tensor_tables(m.tensors, parse_tensor_table(tables[r], "rank " + std::to_string(r)));
  write_metadata(temp_dir_path(target), m);
  CommitOptions opts;
  for (int r = 0; r < world; ++r) opts.expected_files.push_back(rank_file_name(r));
  opts.expected_files.push_back(kMetadataFileName);
  commit_save(target, opts);
}

void check_load(CheckpointReader& reader, int tp) {
  for (size_t i = 0; i < kParams.size(); ++i) {
    const Param& p = kParams[i];
    for (int r = 0; r < tp; ++r) {
      Box box = tp_box(p, r, tp);
      for (bool opt : {false, true}) {
        std::vector<float> got(size_t(box_volume(box)), -1.0f);
        reader.read((opt ? "optimizer.exp_avg." : "") + p.name, DType::F32, p.shape, box, got.data());
        EXPECT_EQ(got, extract(global_values(i, opt), p.shape, box)) << p.name << " tp " << tp << " rank " << r;
      }
    }
  }
}

TEST(ShardedIo, SaveTp2Dp2LoadAnyLayout) {
  TempDir dir;
  save_toy(dir.path(), 100, 2, 2);
  CheckpointReader reader(locate_latest_checkpoint(dir.path()));
  const auto& m = reader.metadata();
  EXPECT_EQ(m.iteration, 100);
  EXPECT_EQ(m.parallel.world_size, 4);
  // The layernorm is stored once, marked as held by all 4 ranks.
  const auto& ln = m.tensors.at("decoder.layers.0.input_layernorm.weight");
  ASSERT_EQ(ln.shards.size(), 1u);
  EXPECT_EQ(ln.shards[0].replicas, 4);
  EXPECT_EQ(m.tensors.at("embedding.word_embeddings.weight").shards.size(), 2u);
  for (int tp : {1, 2, 4}) check_load(reader, tp);
  // An arbitrary box crossing every shard boundary.
  const Param& proj = kParams[2];
  Box odd{{1, 3}, {6, 8}};
  std::vector<float> got(48);
  reader.read("optimizer.exp_avg." + proj.name, DType::F32, proj.shape, odd, got.data());
  EXPECT_EQ(got, extract(global_values(2, true), proj.shape, odd));
  // The files are plain safetensors with {"format": "pt"}.
  auto f = SafetensorsFile::open(dir / "iter_0000100/rank_00000.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST(ShardedIo, SaveTp1Dp3LoadTp2) {
  TempDir dir;
  save_toy(dir.path(), 7, 1, 3);
  CheckpointReader reader(locate_latest_checkpoint(dir.path()));
  check_load(reader, 2);
  check_load(reader, 1);
}

TEST(ShardedIo, MismatchedModelGivesClearErrors) {
  TempDir dir;
  save_toy(dir.path(), 100, 2, 1);
  CheckpointReader reader(locate_latest_checkpoint(dir.path()));
  std::vector<float> buf(1024);
  const std::string emb = "embedding.word_embeddings.weight";
  std::string msg = error_of([&] { reader.read(emb, DType::F32, {32, 8}, whole({32, 8}), buf.data()); });
  EXPECT_NE(msg.find("tensor 'embedding.word_embeddings.weight' has shape [16, 8] in checkpoint"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the model expects [32, 8]"), std::string::npos) << msg;
  msg = error_of([&] { reader.read(emb, DType::BF16, {16, 8}, whole({16, 8}), buf.data()); });
  EXPECT_NE(msg.find("is F32 in checkpoint"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the model expects BF16"), std::string::npos) << msg;
  msg = error_of([&] { reader.read("embedding.word_embedding.weight", DType::F32, {16, 8}, whole({16, 8}), buf.data()); });
  EXPECT_NE(msg.find("has no tensor 'embedding.word_embedding.weight' (did you mean "
                     "'embedding.word_embeddings.weight'?)"), std::string::npos) << msg;
}

TEST(ShardedIo, MissingOrDamagedShardFiles) {
  TempDir dir;
  save_toy(dir.path(), 100, 2, 1);
  const std::string ckpt = dir / "iter_0000100";
  std::vector<float> buf(1024);
  const Param& qkv = kParams[1];
  {
    // Rank 1's file vanished: loading what it held fails, naming it; rank 0's half still loads.
    fs::rename(ckpt + "/rank_00001.safetensors", ckpt + "/moved");
    CheckpointReader reader(locate_latest_checkpoint(dir.path()));
    std::string msg = error_of([&] { reader.read(qkv.name, DType::F32, qkv.shape, whole(qkv.shape), buf.data()); });
    EXPECT_NE(msg.find("shard file rank_00001.safetensors is missing"), std::string::npos) << msg;
    EXPECT_NO_THROW(reader.read(qkv.name, DType::F32, qkv.shape, split_box(qkv.shape, 0, 0, 2), buf.data()));
    fs::rename(ckpt + "/moved", ckpt + "/rank_00001.safetensors");
  }
  {
    // Truncated file.
    std::string bytes = slurp(ckpt + "/rank_00001.safetensors");
    spit(ckpt + "/rank_00001.safetensors", bytes.substr(0, bytes.size() - 10));
    CheckpointReader reader(locate_latest_checkpoint(dir.path()));
    std::string msg = error_of([&] { reader.read(qkv.name, DType::F32, qkv.shape, whole(qkv.shape), buf.data()); });
    EXPECT_NE(msg.find("rank_00001.safetensors is truncated"), std::string::npos) << msg;
  }
  {
    // Metadata is missing: not an fp8tron checkpoint.
    fs::remove(ckpt + "/" + kMetadataFileName);
    std::string msg = error_of([&] { CheckpointReader reader(locate_latest_checkpoint(dir.path())); });
    EXPECT_NE(msg.find("fp8tron_checkpoint.json is missing"), std::string::npos) << msg;
  }
}

TEST(ShardedIo, MetadataThatDisagreesWithTheFiles) {
  TempDir dir;
  save_toy(dir.path(), 100, 1, 1);
  CheckpointMetadata m = read_metadata(dir / "iter_0000100");
  m.tensors.at(kParams[0].name).shards[0].key = "renamed";
  write_metadata(dir / "iter_0000100", m);
  CheckpointReader reader(locate_latest_checkpoint(dir.path()));
  std::vector<float> buf(1024);
  std::string msg = error_of([&] { reader.read(kParams[0].name, DType::F32, kParams[0].shape, whole(kParams[0].shape), buf.data()); });
  EXPECT_NE(msg.find("rank_00000.safetensors has no tensor 'renamed'"), std::string::npos) << msg;
}

TEST(ShardedIo, RankFileNames) {
  EXPECT_EQ(rank_file_name(0), "rank_00000.safetensors");
  EXPECT_EQ(rank_file_name(1234), "rank_01234.safetensors");
}

}  // namespace
}  // namespace fp8tron::checkpoint
