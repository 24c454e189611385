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

int64_t Communicator::check_all_to_all_v(const torch::Tensor& out, const torch::Tensor& in,
                                         const std::vector<int64_t>& send_rows,
                                         const std::vector<int64_t>& recv_rows) const {
  const char* op = "all_to_all_v";
  FP8TRON_CHECK(int(send_rows.size()) == size_ && int(recv_rows.size()) == size_,
                strprintf("%s on '%s': %zu send / %zu receive counts for %d ranks", op, name_.c_str(), send_rows.size(),
                          recv_rows.size(), size_));
  FP8TRON_CHECK(out.is_contiguous() && in.is_contiguous(), std::string(op) + " needs contiguous tensors");
  FP8TRON_CHECK(out.scalar_type() == in.scalar_type(), std::string(op) + ": both tensors must have one dtype");
  FP8TRON_CHECK(out.dim() >= 1 && in.dim() >= 1, std::string(op) + ": tensors of rows");
  int64_t sent = 0, received = 0;
  for (int r = 0; r < size_; ++r) {
    FP8TRON_CHECK(send_rows[size_t(r)] >= 0 && recv_rows[size_t(r)] >= 0, std::string(op) + ": negative count");
    sent += send_rows[size_t(r)];
    received += recv_rows[size_t(r)];
  }
  FP8TRON_CHECK(sent == in.size(0) && received == out.size(0),
                strprintf("%s: the counts send %lld and receive %lld rows, the tensors have %lld and %lld", op,
                          (long long)sent, (long long)received, (long long)in.size(0), (long long)out.size(0)));
  auto row_of = [](const torch::Tensor& t) {
    int64_t n = 1;
    for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
    return n;
  };
  FP8TRON_CHECK(row_of(in) == row_of(out), std::string(op) + ": rows of different sizes");
  return row_of(in);
}

}  // namespace fp8tron
