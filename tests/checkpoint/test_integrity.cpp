// Checkpoint integrity, torch-free: tensor checksums written with the shards and verified on load
// (a flipped byte is named by file and tensor), retention's rename-aside deletion, the lock that
// keeps a second job out of a save directory, and the test-only fault points.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>

#include "core/error.h"
#include "tests/checkpoint/temp_dir.h"
#include "checkpoint/checksum.h"
#include "checkpoint/fault_points.h"
#include "checkpoint/save_dir_lock.h"
#include "checkpoint/sharded_io.h"
#include "tests/checkpoint/error_text.h"

namespace fp8tron::checkpoint {
namespace {

using testing::error_of;

using testing::slurp;
using testing::spit;
using testing::TempDir;

TEST(Checksum, Xxh3OfKnownInputsAndInPieces) {
  // XXH3-64 reference values (xxHash's own test vectors: empty input, and "a").
  EXPECT_EQ(checksum64("", 0), 0x2D06800538D394C2ull);
  EXPECT_EQ(checksum_hex(checksum64("", 0)), "2d06800538d394c2");
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = char(i * 7 + i / 13);
  Checksum64 pieces;
  for (size_t at = 0; at < data.size(); at += 4093) pieces.update(data.data() + at, std::min<size_t>(4093, data.size() - at));
  EXPECT_EQ(pieces.digest(), checksum64(data.data(), data.size()));
  EXPECT_EQ(parse_checksum_hex(checksum_hex(pieces.digest())), pieces.digest());
  EXPECT_FALSE(parse_checksum_hex("2d06800538d394c"));   // 15 digits
  EXPECT_FALSE(parse_checksum_hex("2d06800538d394cG"));  // not hex
  data[5000] ^= 1;
  EXPECT_NE(checksum64(data.data(), data.size()), pieces.digest());
}

TEST(Checksum, SafetensorsWriterReturnsEachTensorsChecksum) {
  TempDir dir;
  std::vector<float> a(1000), b(77);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -float(i);
  std::vector<TensorToWrite> tensors = {{"a", DType::F32, {1000}, a.data(), {}},
                                        {"b", DType::F32, {77}, nullptr, [&](uint64_t offset, void* dst, size_t n) {
                                           std::memcpy(dst, reinterpret_cast<const char*>(b.data()) + offset, n);
                                         }}};
  WriteOptions small;
  small.buffer_bytes = 64;  // the fill function is asked for many pieces
  small.fsync = false;
  const WriteStats stats = write_safetensors(dir / "x.safetensors", tensors, {}, small);
  ASSERT_EQ(stats.checksums.size(), 2u);
  EXPECT_EQ(stats.checksums[0], checksum64(a.data(), a.size() * 4));
  EXPECT_EQ(stats.checksums[1], checksum64(b.data(), b.size() * 4));
}

// A one-rank checkpoint of two tensors whose metadata records their checksums, as save.cpp does.
void save_checksummed(const std::string& dir, int64_t iteration, std::vector<float>& weight, std::vector<float>& bias) {
  SaveTarget target{dir, iteration, false, "t" + std::to_string(iteration)};
  RankShardWriter writer(rank_file_name(0));
  writer.add("layer.weight", DType::F32, {8, 16}, whole({8, 16}), weight.data());
  writer.add_flat_range("layer.bias", DType::F32, {4, 4}, whole({4, 4}), 0, 16, bias.data());
  WriteOptions fast;
  fast.fsync = false;
  const WriteStats stats = writer.write(begin_save(target), fast);
  CheckpointMetadata m;
  m.iteration = iteration;
  m.fp8tron_version = "9.9.9";
  m.fp8tron_commit = "abc";
  m.tensors = writer.table();
  const auto keys = writer.keys();
  for (auto& [name, t] : m.tensors)
    for (auto& s : t.shards)
      for (size_t k = 0; k < keys.size(); ++k)
        if (keys[k] == s.key) s.checksum = stats.checksums[k];
  write_metadata(temp_dir_path(target), m);
  commit_save(target);
}

TEST(Checksum, LoadVerifiesEveryStoredTensorAndNamesACorruptOne) {
  TempDir dir;
  std::vector<float> weight(128), bias(16);
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = float(i);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 100.0f + float(i);
  save_checksummed(dir.path(), 1, weight, bias);
  save_checksummed(dir.path(), 2, weight, bias);
  const CheckpointMetadata m = read_metadata(dir / "iter_0000002");
  EXPECT_EQ(m.fp8tron_version, "9.9.9");
  EXPECT_EQ(m.fp8tron_commit, "abc");
  ASSERT_TRUE(m.tensors.at("layer.bias").shards[0].checksum.has_value());

  std::vector<float> got(128);
  {
    CheckpointReader reader(locate_latest_checkpoint(dir.path()));
    EXPECT_TRUE(reader.has_checksums());
    reader.read("layer.weight", DType::F32, {8, 16}, whole({8, 16}), got.data());
    EXPECT_EQ(got, weight);
    EXPECT_EQ(reader.tensors_verified(), 1);
  }
  // 8 bytes flipped in the weight's payload (the last bytes of the file: tensors are stored
  // largest first, so the bias follows the weight).
  const std::string shard = dir / "iter_0000002/rank_00000.safetensors";
  std::string bytes = slurp(shard);
  const size_t at = bytes.size() - 16 * 4 - 40;
  for (size_t i = at; i < at + 8; ++i) bytes[i] = char(~bytes[i]);
  spit(shard, bytes);
  CheckpointReader reader(locate_latest_checkpoint(dir.path()));
  const std::string e = error_of([&] { reader.read("layer.weight", DType::F32, {8, 16}, Box{{2, 0}, {1, 16}}, got.data()); });
  EXPECT_NE(e.find("is corrupt"), std::string::npos) << e;
  EXPECT_NE(e.find("rank_00000.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("tensor 'layer.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("--ckpt-step N (complete iterations: 1)"), std::string::npos) << e;
  // The other tensor is intact and still loads.
  std::vector<float> b(16);
  reader.read("layer.bias", DType::F32, {4, 4}, whole({4, 4}), b.data());
  EXPECT_EQ(b, bias);
  // Without verification the corrupt bytes load (--no-verify-integrity).
  CheckpointReader unchecked(locate_latest_checkpoint(dir.path()), /*verify_checksums=*/false);
  unchecked.read("layer.weight", DType::F32, {8, 16}, whole({8, 16}), got.data());
  EXPECT_NE(got, weight);
  // The previous iteration is intact.
  CheckpointReader previous(locate_checkpoint(dir.path(), 1));
  previous.read("layer.weight", DType::F32, {8, 16}, whole({8, 16}), got.data());
  EXPECT_EQ(got, weight);
}

TEST(Checksum, MetadataRoundTripsChecksumsAndTheSchedule) {
  CheckpointMetadata m;
  m.iteration = 3;
  m.fp8tron_version = "0.1.0";
  m.fp8tron_commit = "1234abcd";
  SchedulerState l;
  l.max_lr = 3e-4;
  l.min_lr = 3e-5;
  l.lr_warmup_steps = 64;
  l.lr_decay_steps = 1024;
  l.lr_decay_style = "cosine";
  l.start_wd = 0.01;
  l.end_wd = 0.1;
  l.wd_incr_steps = 2048;
  l.wd_incr_style = "linear";
  m.lr_scheduler = l;
  ShardEntry s;
  s.file = "rank_00000.safetensors";
  s.key = "w";
  s.offset = {0};
  s.shape = {4};
  s.checksum = 0xfedcba9876543210ull;
  m.tensors["w"] = TensorEntry{DType::F32, {4}, {s}};
  const CheckpointMetadata back = parse_metadata(serialize_metadata(m), "test");
  EXPECT_EQ(back, m);
  // Metadata of fp8tron versions before checksums, schedules and versions still parses.
  std::string old = serialize_metadata(m);
  for (const char* field : {R"(,\s*"xxh3_64": "fedcba9876543210")", R"("fp8tron_version": "0.1.0",)",
                            R"("fp8tron_commit": "1234abcd",)"}) {
    const std::string before = old;
    old = std::regex_replace(old, std::regex(field), "");
    ASSERT_NE(old, before) << field;
  }
  const CheckpointMetadata older = parse_metadata(old, "old");
  EXPECT_FALSE(older.tensors.at("w").shards[0].checksum.has_value());
  EXPECT_EQ(older.fp8tron_version, "");
  std::string bad = serialize_metadata(m);
  bad.replace(bad.find("fedcba9876543210"), 16, "not-a-checksum!!");
  EXPECT_NE(error_of([&] { parse_metadata(bad, "bad"); }).find("xxh3_64' is not 16 hex digits"), std::string::npos);
}

TEST(Retention, DeletionRenamesAsideFirstAndALeftoverIsNeverListed) {
  TempDir dir;
  std::vector<float> weight(128, 1.0f), bias(16, 2.0f);
  for (int64_t it : {1, 2, 3}) save_checksummed(dir.path(), it, weight, bias);
  EXPECT_EQ(delete_checkpoint(dir.path(), 1, "job7"), DeleteResult::kDeleted);
  EXPECT_EQ(delete_checkpoint(dir.path(), 1, "job7"), DeleteResult::kMissing);
  EXPECT_EQ(list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{2, 3}));
  // A kill between the rename and the removal leaves iter_0000002.del.<token>: half of it is
  // gone, but it is not listed as a checkpoint, and the next commit removes it.
  std::filesystem::rename(dir / "iter_0000002", dir / "iter_0000002.del.job8");
  std::filesystem::remove(dir / "iter_0000002.del.job8/fp8tron_checkpoint.json");
  EXPECT_EQ(list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{3}));
  save_checksummed(dir.path(), 4, weight, bias);
  EXPECT_FALSE(std::filesystem::exists(dir / "iter_0000002.del.job8"));
  EXPECT_EQ(list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{3, 4}));
  // A symbolic link is left alone, as Megatron does.
  std::filesystem::create_directory_symlink(dir / "iter_0000003", dir / "iter_0000009");
  EXPECT_EQ(delete_checkpoint(dir.path(), 9, "job9"), DeleteResult::kSymlink);
  EXPECT_TRUE(std::filesystem::exists(dir / "iter_0000003/fp8tron_checkpoint.json"));
}

TEST(SaveDirLock, ASecondJobIsRefusedAndAStaleLockTakenOver) {
  TempDir dir;
  const std::string save = dir / "run";
  {
    auto lock = SaveDirLock::acquire(save);
    EXPECT_EQ(lock->taken_over(), "");
    const std::string text = slurp(save + "/" + kLockFileName);
    EXPECT_NE(text.find("pid=" + std::to_string(getpid())), std::string::npos) << text;
    // Another job (another open file description: its flock conflicts even in this process).
    const std::string e = error_of([&] { SaveDirLock::acquire(save); });
    EXPECT_NE(e.find("--save " + save + " is in use by another fp8tron job (host="), std::string::npos) << e;
    EXPECT_NE(e.find("give this job its own --save"), std::string::npos) << e;
  }
  // Released: the file is empty and the next job takes it.
  EXPECT_EQ(slurp(save + "/" + kLockFileName), "");
  { auto again = SaveDirLock::acquire(save); }
  // A job killed with its lock held leaves its line in the file, but the kernel dropped the flock.
  spit(save + "/" + kLockFileName, "host=elsewhere pid=999999 started=2026-01-01T00:00:00Z\n");
  auto taken = SaveDirLock::acquire(save);
  EXPECT_EQ(taken->taken_over(), "host=elsewhere pid=999999 started=2026-01-01T00:00:00Z");
}

TEST(FaultPoints, UnknownNamesAreRefusedWithTheList) {
  const std::string e = error_of([] { arm_fault_point("commit:exploded"); });
  EXPECT_NE(e.find("unknown point; known points: save:shard-written"), std::string::npos) << e;
  EXPECT_NE(error_of([] { arm_fault_point("commit:renamed-into-place@0"); }).find("positive integer"), std::string::npos);
  for (const auto& name : fault_point_names()) fault_point(name);  // unarmed: nothing happens
}

}  // namespace
}  // namespace fp8tron::checkpoint
