#include "checkpoint/rank_agreement.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace fp8tron {

bool any_rank(const ParallelState& p, const torch::Device& device, bool flag) {
  if (p.sizes.world_size == 1) return flag;
  auto t = torch::full({1}, flag ? 1.0f : 0.0f, torch::TensorOptions().device(device));
  p.world->all_reduce(t, ReduceOp::Max);
  return t.item<float>() > 0;
}

void barrier(const ParallelState& p) {
  if (p.sizes.world_size > 1) p.world->barrier();
}

std::vector<std::string> all_gather_strings(const ParallelState& p, const torch::Device& device, const std::string& mine) {
  const int n = p.sizes.world_size;
  if (n == 1) return {mine};
  const auto on_device = torch::TensorOptions().device(device);
  auto length = torch::full({1}, int64_t(mine.size()), on_device.dtype(torch::kInt64));
  auto lengths = torch::empty({n}, length.options());
  p.world->all_gather(lengths, length);
  lengths = lengths.cpu();
  const int64_t longest = std::max<int64_t>(1, lengths.max().item<int64_t>());
  auto buffer = torch::zeros({longest}, torch::kUInt8);
  if (!mine.empty()) std::memcpy(buffer.data_ptr(), mine.data(), mine.size());
  buffer = buffer.to(device);
  auto all = torch::empty({n * longest}, buffer.options());
  p.world->all_gather(all, buffer);
  all = all.cpu();
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r)
    out.emplace_back(reinterpret_cast<const char*>(all.data_ptr()) + r * longest, size_t(lengths[r].item<int64_t>()));
  return out;
}

std::string pack(const std::vector<std::string>& fields) {
  std::string out;
  for (const auto& f : fields) {
    const uint64_t n = f.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out += f;
  }
  return out;
}

std::vector<std::string> unpack(const std::string& packed) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < packed.size()) {
    uint64_t n = 0;
    FP8TRON_CHECK(at + sizeof n <= packed.size(), "truncated field");
    std::memcpy(&n, packed.data() + at, sizeof n);
    at += sizeof n;
    FP8TRON_CHECK(at + n <= packed.size(), "truncated field");
    out.push_back(packed.substr(at, n));
    at += n;
  }
  return out;
}

std::string agree_on_token(const ParallelState& p, const torch::Device& device) {
  const int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  auto t = torch::full({1}, now ^ (int64_t(getpid()) << 40), torch::TensorOptions().dtype(torch::kInt64).device(device));
  if (p.sizes.world_size > 1) p.world->broadcast(t, 0);
  return std::to_string(std::abs(t.cpu().item<int64_t>()));
}

}  // namespace fp8tron
