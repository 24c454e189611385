#include "parallel/communicator.h"

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {

std::vector<int64_t> Communicator::piece_offsets(const char* op, const torch::Tensor& whole, const torch::Tensor& mine,
                                                 const std::vector<int64_t>& counts) const {
  FP8TRON_CHECK(int(counts.size()) == size_, strprintf("%s on '%s': %zu counts for %d ranks", op, name_.c_str(), counts.size(), size_));
  FP8TRON_CHECK(whole.is_contiguous() && mine.is_contiguous(), std::string(op) + " needs contiguous tensors");
  FP8TRON_CHECK(whole.scalar_type() == mine.scalar_type(), std::string(op) + ": both tensors must have one dtype");
  std::vector<int64_t> offsets(counts.size());
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    FP8TRON_CHECK(counts[r] >= 0, std::string(op) + ": negative count");
    offsets[r] = total;
    total += counts[r];
  }
  FP8TRON_CHECK(whole.numel() == total, strprintf("%s: the pieces hold %lld elements, the buffer %lld", op, (long long)total,
                                                  (long long)whole.numel()));
  FP8TRON_CHECK(mine.numel() == counts[size_t(rank_)], strprintf("%s: this rank's piece has %lld elements, expected %lld", op,
                                                                 (long long)mine.numel(), (long long)counts[size_t(rank_)]));
  return offsets;
}

}  // namespace fp8tron
