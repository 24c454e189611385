// The safetensors writer and reader: exact bytes, round trips of every dtype, alignment,
// streaming through the staging buffer, and a clear UserError for every kind of bad file.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "tests/checkpoint/temp_dir.h"

namespace fp8tron::checkpoint {
namespace {

using testing::from_hex;
using testing::slurp;
using testing::spit;
using testing::TempDir;

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char((v >> (8 * i)) & 0xff);
  return s;
}

// Writes a file from a hand-written header (padded as given) and raw data.
std::string make_file(const TempDir& dir, const std::string& header, const std::string& data,
                      const std::string& name = "bad.safetensors") {
  std::string path = dir / name;
  spit(path, le64(header.size()) + header + data);
  return path;
}

// Expects open(path) to throw a UserError whose message names the file and contains `part`.
void expect_bad(const std::string& path, const std::string& part) {
  try {
    SafetensorsFile::open(path);
    FAIL() << "no error for " << path << " (expected '" << part << "')";
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line error: " << msg;
  }
}

TEST(Safetensors, GoldenBytesOneTensor) {
  // Derived by hand from the format: the JSON below is 54 bytes, padded with two spaces to 56
  // (a multiple of 8), so the length prefix is 56 = 0x38; then 1.0f = 0x3f800000 and
  // 2.0f = 0x40000000, little-endian.
  const std::string json = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(json.size(), 54u);
  std::string expected = std::string("\x38\0\0\0\0\0\0\0", 8) + json + "  " +
                         std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  // The same bytes the reference implementation (Python safetensors 0.8.0) writes for
  // save({"a": np.array([1, 2], np.float32)}).
  ASSERT_EQ(expected, from_hex("38000000000000007b2261223a7b226474797065223a22463332222c2273686170"
                               "65223a5b325d2c22646174615f6f666673657473223a5b302c385d7d7d2020"
                               "0000803f00000040"));
  TempDir dir;
  const float data[2] = {1.0f, 2.0f};
  write_safetensors(dir / "a.safetensors", {{"a", DType::F32, {2}, data, {}}});
  EXPECT_EQ(slurp(dir / "a.safetensors"), expected);
}

TEST(Safetensors, GoldenBytesMetadataAndOrdering) {
  // Reference output of safetensors 0.8.0 for save({"b": f16 [1, 2, 3], "a": f32 [1, 2],
  // "c": int8 zeros (0, 3)}, metadata={"format": "np"}): "__metadata__" first, tensors largest
  // element first, header padded with five spaces to 200 bytes.
  const std::string expected = from_hex(
      "c8000000000000007b225f5f6d657461646174615f5f223a7b22666f726d6174223a226e70227d2c2261223a"
      "7b226474797065223a22463332222c227368617065223a5b325d2c22646174615f6f666673657473223a5b30"
      "2c385d7d2c2262223a7b226474797065223a22463136222c227368617065223a5b335d2c22646174615f6f66"
      "6673657473223a5b382c31345d7d2c2263223a7b226474797065223a224938222c227368617065223a5b302c"
      "335d2c22646174615f6f666673657473223a5b31342c31345d7d7d20202020200000803f00000040003c0040"
      "0042");
  TempDir dir;
  const uint16_t halfs[3] = {0x3c00, 0x4000, 0x4200};  // 1, 2, 3 in IEEE half
  const float floats[2] = {1.0f, 2.0f};
  write_safetensors(dir / "m.safetensors",
                    {{"b", DType::F16, {3}, halfs, {}},
                     {"a", DType::F32, {2}, floats, {}},
                     {"c", DType::I8, {0, 3}, nullptr, {}}},
                    {{"format", "np"}});
  EXPECT_EQ(slurp(dir / "m.safetensors"), expected);
}

TEST(Safetensors, HeaderIsPaddedToEightBytes) {
  for (size_t len = 1; len <= 16; ++len) {
    std::string name(len, 'x');
    auto layout = plan_safetensors({{name, DType::U8, {1}, "z", {}}}, {});
    uint64_t n = 0;
    std::memcpy(&n, layout.header.data(), 8);
    EXPECT_EQ(n % 8, 0u);
    EXPECT_EQ(layout.header.size(), 8 + n);
    size_t close = layout.header.find_last_of('}');
    EXPECT_LT(layout.header.size() - close - 1, 8u);
    EXPECT_EQ(layout.header.find_first_not_of(' ', close + 1), std::string::npos);
  }
}

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  std::mt19937 rng(7);
  std::vector<std::string> buffers;
  std::vector<TensorToWrite> tensors;
  int i = 0;
  for (const std::string& dn : dtype_names()) {
    DType dt = *parse_dtype(dn);
    Shape shape = {int64_t(1 + i % 3), int64_t(2 + i % 5)};
    std::string bytes(size_t(shape[0] * shape[1]) * dtype_size(dt), '\0');
    for (auto& c : bytes) c = char(rng());
    buffers.push_back(bytes);
    ++i;
  }
  i = 0;
  for (const std::string& dn : dtype_names()) {
    DType dt = *parse_dtype(dn);
    tensors.push_back({"t." + dn, dt, {int64_t(1 + i % 3), int64_t(2 + i % 5)}, buffers[i].data(), {}});
    ++i;
  }
  tensors.push_back({"scalar", DType::F64, {}, buffers[0].data(), {}});
  tensors.push_back({"empty", DType::BF16, {4, 0, 2}, nullptr, {}});
  std::map<std::string, std::string> md = {{"format", "pt"}, {"note", "h\u00e9llo \"quoted\"\n"}};
  write_safetensors(dir / "all.safetensors", tensors, md);

  auto f = SafetensorsFile::open(dir / "all.safetensors");
  EXPECT_EQ(f.metadata(), md);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    const auto& t = tensors[k];
    const TensorView& v = f.at(t.name);
    EXPECT_EQ(v.dtype, t.dtype) << t.name;
    EXPECT_EQ(v.shape, t.shape) << t.name;
    ASSERT_EQ(v.nbytes, uint64_t(*checked_numel(t.shape)) * dtype_size(t.dtype)) << t.name;
    if (v.nbytes) {
      EXPECT_EQ(std::memcmp(v.data, t.data, v.nbytes), 0) << t.name;
    }
    // Natural alignment inside the (page-aligned) mapping.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % dtype_size(v.dtype), 0u) << t.name;
  }
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(Safetensors, StreamsLargeAndFilledTensorsThroughSmallBuffer) {
  TempDir dir;
  std::vector<float> big(300001), small(7);
  for (size_t k = 0; k < big.size(); ++k) big[k] = float(k) * 0.5f;
  for (size_t k = 0; k < small.size(); ++k) small[k] = -float(k);
  std::vector<int32_t> filled(123457);
  for (size_t k = 0; k < filled.size(); ++k) filled[k] = int32_t(k * 2654435761u);
  size_t fill_calls = 0;
  auto fill = [&](uint64_t offset, void* dst, size_t n) {
    ++fill_calls;
    std::memcpy(dst, reinterpret_cast<const char*>(filled.data()) + offset, n);
  };
  WriteOptions opt;
  opt.buffer_bytes = 64 * 1024;
  opt.writeback_every = 100 * 1024;
  auto stats = write_safetensors(dir / "s.safetensors",
                                 {{"small", DType::F32, {7}, small.data(), {}},
                                  {"big", DType::F32, {300001}, big.data(), {}},
                                  {"filled", DType::I32, {123457}, nullptr, fill}},
                                 {}, opt);
  EXPECT_GT(fill_calls, 5u);
  EXPECT_EQ(stats.bytes, std::filesystem::file_size(dir / "s.safetensors"));
  auto f = SafetensorsFile::open(dir / "s.safetensors");
  EXPECT_EQ(std::memcmp(f.at("big").data, big.data(), big.size() * 4), 0);
  EXPECT_EQ(std::memcmp(f.at("small").data, small.data(), small.size() * 4), 0);
  EXPECT_EQ(std::memcmp(f.at("filled").data, filled.data(), filled.size() * 4), 0);
  EXPECT_FALSE(std::filesystem::exists(dir / "s.safetensors.partial"));
}

TEST(Safetensors, WriterRejectsBadTensors) {
  TempDir dir;
  float x = 0;
  EXPECT_THROW(write_safetensors(dir / "w", {{"a", DType::F32, {1}, &x, {}}, {"a", DType::F32, {1}, &x, {}}}),
               UserError);
  EXPECT_THROW(write_safetensors(dir / "w", {{"__metadata__", DType::F32, {1}, &x, {}}}), UserError);
  EXPECT_THROW(write_safetensors(dir / "w", {{"", DType::F32, {1}, &x, {}}}), UserError);
  EXPECT_THROW(write_safetensors(dir / "w", {{"neg", DType::F32, {-1}, &x, {}}}), UserError);
  EXPECT_THROW(write_safetensors(dir / "w", {{"nodata", DType::F32, {1}, nullptr, {}}}), UserError);
  EXPECT_THROW(write_safetensors(dir / "w", {{"bad\xff utf8", DType::F32, {1}, &x, {}}}), UserError);
  EXPECT_FALSE(std::filesystem::exists(dir / "w"));
}

TEST(Safetensors, DiskFullIsAClearErrorAndLeavesNothingBehind) {
  TempDir dir;
  std::vector<float> data(1 << 16, 1.0f);
  // An earlier good file under the same name must survive a failed rewrite.
  write_safetensors(dir / "x.safetensors", {{"old", DType::F32, {2}, data.data(), {}}});
  const std::string before = slurp(dir / "x.safetensors");
  for (int64_t fail_at : {int64_t(0), int64_t(5), int64_t(100), int64_t(70000), int64_t(262000)}) {
    WriteOptions opt;
    opt.fault.fail_after_bytes = fail_at;
    opt.buffer_bytes = 4096;
    try {
      write_safetensors(dir / "x.safetensors", {{"new", DType::F32, {1 << 16}, data.data(), {}}}, {}, opt);
      FAIL() << "no error when failing after " << fail_at;
    } catch (const UserError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("disk full"), std::string::npos) << msg;
      EXPECT_NE(msg.find(dir / "x.safetensors"), std::string::npos) << msg;
    }
    EXPECT_FALSE(std::filesystem::exists(dir / "x.safetensors.partial"));
    EXPECT_EQ(slurp(dir / "x.safetensors"), before);
  }
  WriteOptions eio;
  eio.fault = {10, EIO};
  try {
    write_safetensors(dir / "y.safetensors", {{"t", DType::F32, {4}, data.data(), {}}}, {}, eio);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("I/O error"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "y.safetensors"));
}

TEST(Safetensors, UnwritableDirectoryIsAUserError) {
  TempDir dir;
  float x = 0;
  EXPECT_THROW(write_safetensors(dir / "no/such/dir/f.safetensors", {{"a", DType::F32, {1}, &x, {}}}),
               UserError);
}

// ---- corrupt and truncated files ----

TEST(SafetensorsCorrupt, TooShortForTheLength) {
  TempDir dir;
  spit(dir / "t", "abc");
  expect_bad(dir / "t", "fewer than the 8-byte");
  spit(dir / "e", "");
  expect_bad(dir / "e", "fewer than the 8-byte");
}

TEST(SafetensorsCorrupt, HeaderLongerThanFile) {
  TempDir dir;
  spit(dir / "t", le64(1000) + "{}");
  expect_bad(dir / "t", "truncated");
}

TEST(SafetensorsCorrupt, HugeHeaderLength) {
  TempDir dir;
  spit(dir / "t", le64(uint64_t(1) << 40) + "{}");
  expect_bad(dir / "t", "100 MB");
}

TEST(SafetensorsCorrupt, TruncatedData) {
  TempDir dir;
  std::vector<float> data(1000, 3.0f);
  write_safetensors(dir / "ok", {{"w", DType::F32, {1000}, data.data(), {}}});
  std::string bytes = slurp(dir / "ok");
  spit(dir / "cut", bytes.substr(0, bytes.size() - 100));
  expect_bad(dir / "cut", "truncated");
  spit(dir / "cuthead", bytes.substr(0, 30));
  expect_bad(dir / "cuthead", "truncated");
}

TEST(SafetensorsCorrupt, NotJson) {
  TempDir dir;
  expect_bad(make_file(dir, "{\"a\": [1, 2   ", ""), "corrupt safetensors header");
  expect_bad(make_file(dir, "[1, 2, 3]       ", ""), "its header starts with '[1, 2, 3]       ', not '{'");
  expect_bad(make_file(dir, "\xc8\x01\n\\       ", ""), "its header starts with '\\xc8\\x01\\x0a\\\\       ', not '{'");
  expect_bad(make_file(dir, "{}xx    ", ""), "corrupt safetensors header");
}

TEST(SafetensorsCorrupt, BadEntries) {
  TempDir dir;
  const std::string eight(8, 'z');
  expect_bad(make_file(dir, R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", eight), "dtype 'F33'");
  expect_bad(make_file(dir, R"({"a":{"shape":[2],"data_offsets":[0,8]}})", eight), "no 'dtype'");
  expect_bad(make_file(dir, R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight), "no 'shape'");
  expect_bad(make_file(dir, R"({"a":{"dtype":"F32","shape":[2]}})", eight), "no 'data_offsets'");
  expect_bad(make_file(dir, R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight), "non-negative");
  expect_bad(make_file(dir, R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", eight), "non-negative");
  expect_bad(make_file(dir, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight), "bytes but its data_offsets span 8");
  expect_bad(make_file(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight), "begin after end");
  expect_bad(make_file(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", eight), "data_offsets [begin, end]");
  expect_bad(make_file(dir, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight), "ends at data offset 16");
  expect_bad(make_file(dir, R"({"a":[1]})", eight), "not an object");
  expect_bad(make_file(dir, R"({"__metadata__":{"k":1}})", ""), "not a string");
  expect_bad(make_file(dir, R"({"__metadata__":[]})", ""), "'__metadata__' must be an object");
}

TEST(SafetensorsCorrupt, OverlapGapTrailingAndDuplicates) {
  TempDir dir;
  const std::string sixteen(16, 'q');
  expect_bad(make_file(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       std::string(12, 'q')),
             "overlaps");
  expect_bad(make_file(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                       sixteen),
             "gap of 4 bytes");
  expect_bad(make_file(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", sixteen),
             "8 bytes after its last tensor");
  expect_bad(make_file(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                       sixteen),
             "appears twice");
}

TEST(SafetensorsCorrupt, OutOfOrderButContiguousIsValid) {
  // The format allows any header order as long as the data is exactly tiled.
  TempDir dir;
  std::string data = std::string("\x01\x02\x03\x04", 4) + std::string("\x05\x06", 2);
  std::string path = make_file(dir, R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", data, "ok");
  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "a");  // data order
  EXPECT_EQ(uint8_t(f.at("b").data[1]), 6);
}

TEST(SafetensorsCorrupt, MissingTensorSuggestsAName) {
  TempDir dir;
  float x[2] = {0, 0};
  write_safetensors(dir / "f", {{"decoder.layers.0.weight", DType::F32, {2}, x, {}}});
  auto f = SafetensorsFile::open(dir / "f");
  try {
    f.at("decoder.layers.0.wieght");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'decoder.layers.0.weight'"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsCorrupt, MissingFileIsAUserError) {
  TempDir dir;
  expect_bad(dir / "absent.safetensors", "could not read " + dir / "absent.safetensors" + ": it does not exist");
}

}  // namespace
}  // namespace fp8tron::checkpoint
