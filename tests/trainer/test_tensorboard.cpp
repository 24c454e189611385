// TensorBoard event files: CRC-32C vectors, writer/reader round trip, file naming, and the errors a
// user sees for a corrupt file or an unusable --tensorboard-dir.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "checkpoint/file_io.h"
#include "trainer/logging/tensorboard_writer.h"

namespace fp8tron {
namespace {

namespace fs = std::filesystem;

class TensorBoardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fp8tron_tb_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    checkpoint::remove_tree(dir_.string());
  }
  // Not std::filesystem::remove_all: libtorch exports a broken copy of it (file_io.h).
  void TearDown() override { checkpoint::remove_tree(dir_.string()); }

  fs::path dir_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Minimal independent encoders, so the reader can be fed records the writer never produces.
void varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(char(v | 0x80));
  out.push_back(char(v));
}
void fixed(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char(v >> (8 * i)));
}
void field_bytes(std::string& out, int field, const std::string& bytes) {
  varint(out, uint64_t(field) << 3 | 2);
  varint(out, bytes.size());
  out += bytes;
}
std::string frame(const std::string& data) {
  std::string len;
  fixed(len, data.size(), 8);
  std::string record = len;
  fixed(record, masked_crc32c(len), 4);
  record += data;
  fixed(record, masked_crc32c(data), 4);
  return record;
}

// Expects read_tensorboard_scalars(path) to fail with a UserError that names the file.
void expect_corrupt(const std::string& path) {
  try {
    read_tensorboard_scalars(path);
    ADD_FAILURE() << "no UserError for " << path;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  // RFC 3720 (iSCSI) appendix B.4 vectors.
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(char(i));
    descending.push_back(char(31 - i));
  }
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
}

TEST(Crc32c, Masked) {
  // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8, mod 2^32.
  EXPECT_EQ(masked_crc32c("123456789"), 0xC78AB0E5u);
}

TEST_F(TensorBoardTest, RoundTripsScalars) {
  struct Point { std::string tag; double value; int64_t step; };
  const std::vector<Point> points = {
      {"lm loss", 10.375, 1},
      {"learning-rate", 3e-4, 1},
      {"lm loss", -0.5, 2},
      {"grad-norm", 1e30, int64_t(1) << 40},
      {"iteration-time", 0.0, -3},  // negative int64 steps take the ten-byte varint path
  };
  double before = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string path;
  {
    TensorBoardWriter writer((dir_ / "nested" / "tb").string());  // created recursively
    path = writer.path();
    for (const auto& p : points) writer.add_scalar(p.tag, p.value, p.step);
  }  // destructor flushes
  double after = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();

  EXPECT_NE(read_bytes(path).find("brain.Event:2"), std::string::npos);
  std::vector<ScalarEvent> events = read_tensorboard_scalars(path);
  ASSERT_EQ(events.size(), points.size());  // the file_version record holds no scalar
  for (size_t i = 0; i < points.size(); ++i) {
    EXPECT_EQ(events[i].tag, points[i].tag);
    EXPECT_EQ(events[i].value, double(float(points[i].value)));  // stored as simple_value (float)
    EXPECT_EQ(events[i].step, points[i].step);
    EXPECT_GE(events[i].wall_time, before);
    EXPECT_LE(events[i].wall_time, after);
  }
}

TEST_F(TensorBoardTest, FlushMakesScalarsReadable) {
  TensorBoardWriter writer(dir_.string());
  writer.add_scalar("loss", 2.0, 5);
  writer.flush();
  std::vector<ScalarEvent> events = read_tensorboard_scalars(writer.path());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].tag, "loss");
  EXPECT_EQ(events[0].value, 2.0);
  EXPECT_EQ(events[0].step, 5);
}

TEST_F(TensorBoardTest, FileNamePattern) {
  auto before = std::chrono::system_clock::now();
  TensorBoardWriter writer(dir_.string());
  auto after = std::chrono::system_clock::now();

  fs::path path(writer.path());
  EXPECT_EQ(path.parent_path(), dir_);
  std::smatch m;
  std::string name = path.filename().string();
  ASSERT_TRUE(std::regex_match(name, m, std::regex(R"(events\.out\.tfevents\.(\d+)\.(.+)\.(\d+))"))) << name;
  auto seconds = [](auto t) { return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count(); };
  EXPECT_GE(std::stoll(m[1]), seconds(before));
  EXPECT_LE(std::stoll(m[1]), seconds(after));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(m[2].str(), host);
  EXPECT_EQ(std::stoll(m[3]), getpid());
}

TEST_F(TensorBoardTest, TwoWritersInOneDirectoryDoNotClobber) {
  TensorBoardWriter a(dir_.string());
  TensorBoardWriter b(dir_.string());
  EXPECT_NE(a.path(), b.path());
  a.add_scalar("a", 1.0, 1);
  b.add_scalar("b", 2.0, 1);
  a.flush();
  b.flush();
  EXPECT_EQ(read_tensorboard_scalars(a.path()).at(0).tag, "a");
  EXPECT_EQ(read_tensorboard_scalars(b.path()).at(0).tag, "b");
}

TEST_F(TensorBoardTest, SkipsUnknownFieldsAndNonScalarValues) {
  std::string tensor_value;  // Value{ tag = "hist"; tensor = 8 } : not a simple_value, left out
  field_bytes(tensor_value, 1, "hist");
  field_bytes(tensor_value, 8, "opaque tensor");
  std::string scalar_value;  // Value{ unknown varint 9; tag = "b"; simple_value = 2.5 }
  varint(scalar_value, 9 << 3 | 0);
  varint(scalar_value, 300);
  field_bytes(scalar_value, 1, "b");
  varint(scalar_value, 2 << 3 | 5);
  fixed(scalar_value, 0x40200000, 4);  // 2.5f
  std::string summary;
  field_bytes(summary, 1, tensor_value);
  varint(summary, 7 << 3 | 1);  // unknown fixed64
  fixed(summary, 42, 8);
  field_bytes(summary, 1, scalar_value);

  std::string event;  // summary before step and wall_time, plus unknown fields of every wire type
  field_bytes(event, 4, "graph_def bytes");
  field_bytes(event, 5, summary);
  varint(event, 12 << 3 | 5);
  fixed(event, 7, 4);
  varint(event, 2 << 3 | 0);
  varint(event, 7);
  varint(event, 1 << 3 | 1);
  fixed(event, 0x41D0000000000000ull, 8);  // 1073741824.0

  fs::create_directories(dir_);
  std::string path = (dir_ / "events.out.tfevents.handmade").string();
  write_bytes(path, frame(event));
  std::vector<ScalarEvent> events = read_tensorboard_scalars(path);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].tag, "b");
  EXPECT_EQ(events[0].value, 2.5);
  EXPECT_EQ(events[0].step, 7);
  EXPECT_EQ(events[0].wall_time, 1073741824.0);
}

TEST_F(TensorBoardTest, MalformedProtobufWithValidCrcIsAnError) {
  fs::create_directories(dir_);
  std::string path = (dir_ / "events.out.tfevents.bad").string();
  write_bytes(path, frame(std::string("\x1a\x05" "ab", 4)));  // string field claims 5 bytes, has 2
  expect_corrupt(path);
}

TEST_F(TensorBoardTest, CorruptedByteIsAnError) {
  std::string path;
  {
    TensorBoardWriter writer(dir_.string());
    writer.add_scalar("loss", 1.0, 1);
    writer.add_scalar("loss", 0.5, 2);
    path = writer.path();
  }
  const std::string good = read_bytes(path);
  // One flipped byte in the last record's data, then in the first record's length.
  for (size_t offset : {good.size() - 10, size_t(0)}) {
    std::string bad = good;
    bad[offset] ^= 0x01;
    write_bytes(path, bad);
    SCOPED_TRACE(offset);
    expect_corrupt(path);
  }
}

TEST_F(TensorBoardTest, TruncatedFileIsAnError) {
  std::string path;
  {
    TensorBoardWriter writer(dir_.string());
    writer.add_scalar("loss", 1.0, 1);
    path = writer.path();
  }
  const std::string good = read_bytes(path);
  const size_t first_record = good.find("brain.Event:2") + 13 + 4;  // file_version is its last field
  // Cut inside the data CRC, inside the data, and inside the second record's header.
  for (size_t size : {good.size() - 3, good.size() - 12, first_record + 5}) {
    write_bytes(path, good.substr(0, size));
    SCOPED_TRACE(size);
    expect_corrupt(path);
  }
}

TEST_F(TensorBoardTest, UncreatableDirectoryIsAnError) {
  fs::create_directories(dir_);
  const std::string blocker = (dir_ / "regular_file").string();
  write_bytes(blocker, "not a directory");
  for (const std::string& log_dir : {blocker + "/tb", blocker}) {
    try {
      TensorBoardWriter writer(log_dir);
      ADD_FAILURE() << "no UserError for " << log_dir;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(log_dir), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace fp8tron
