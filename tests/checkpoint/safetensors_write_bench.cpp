// Throughput of the safetensors writer on a local disk (a benchmark, not a test):
//   fp8tron_checkpoint_bench [dir] [GiB] [tensors] [repetitions]
// Writes one file of the given size made of `tensors` equal F32 tensors from host memory, in
// several modes, each from a clean page cache state (sync before, file removed after).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

using namespace fp8tron::checkpoint;

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : ".";
  double gib = argc > 2 ? std::atof(argv[2]) : 1.0;
  int count = argc > 3 ? std::atoi(argv[3]) : 8;
  int reps = argc > 4 ? std::atoi(argv[4]) : 3;
  const size_t total = size_t(gib * double(1ull << 30));
  const int64_t per = int64_t(total / 4 / size_t(count));
  std::vector<float> data(size_t(per) * size_t(count));
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i % 1000) * 0.001f;  // touch every page
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < count; ++i)
    tensors.push_back({"t" + std::to_string(i), DType::F32, {per}, data.data() + size_t(i) * size_t(per), {}});

  struct Mode {
    const char* name;
    WriteOptions options;
  };
  std::vector<Mode> modes(5);
  modes[0].name = "fsync (default: reserve + writeback every 256 MiB)";
  modes[1].name = "fsync, no early writeback";
  modes[1].options.writeback_every = 0;
  modes[2].name = "fsync, no reserve";
  modes[2].options.reserve_space = false;
  modes[3].name = "no fsync (page cache only)";
  modes[3].options.fsync = false;
  modes[4].name = "fill callback through 16 MiB staging, fsync";
  std::vector<TensorToWrite> filled = tensors;
  for (auto& t : filled) {
    const char* src = static_cast<const char*>(t.data);
    t.data = nullptr;
    t.fill = [src](uint64_t offset, void* dst, size_t n) { std::memcpy(dst, src + offset, n); };
  }
  const std::string path = dir + "/bench.safetensors";
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t m = 0; m < modes.size(); ++m) {
      ::sync();
      auto stats = write_safetensors(path, m == 4 ? filled : tensors, {}, modes[m].options);
      std::fflush(stdout);
      std::printf("%-52s %7.1f MB/s  (%.2f GB in %.3f s)\n", modes[m].name,
                  double(stats.bytes) / stats.seconds / 1e6, double(stats.bytes) / 1e9, stats.seconds);
      std::filesystem::remove(path);
    }
  }
}
