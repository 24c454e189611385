#include "parallel/overlap/schedule.h"

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::overlap {
namespace {
int mod(int a, int n) { return ((a % n) + n) % n; }
}  // namespace

std::vector<AllGatherStep> ring_all_gather(int n, int r) {
  FP8TRON_CHECK(n >= 1 && r >= 0 && r < n, "ring_all_gather: bad rank");
  std::vector<AllGatherStep> steps(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    AllGatherStep& s = steps[size_t(i)];
    s.compute = {mod(r - i, n)};
    if (i + 1 < n) {
      s.send = {mod(r - i, n)};
      s.send_to = mod(r + 1, n);
      s.recv = {mod(r - i - 1, n)};
      s.recv_from = mod(r - 1, n);
    }
  }
  return steps;
}

std::vector<AllGatherStep> ring_all_gather_aggregate(int n, int r) {
  FP8TRON_CHECK(n >= 4 && n % 2 == 0 && r >= 0 && r < n, "aggregated ring needs an even group of at least 4");
  const int partner = r ^ 1, base = r - r % 2, pairs = n / 2;
  std::vector<AllGatherStep> steps;
  steps.push_back({{}, {r}, partner, {partner}, partner});
  for (int k = 0; k < pairs; ++k) {
    const int c = mod(base - 2 * k, n);
    AllGatherStep s;
    s.compute = {c, c + 1};
    if (k + 1 < pairs) {
      const int next = mod(base - 2 * k - 2, n);
      s.send = {c, c + 1};
      s.send_to = mod(r + 2, n);
      s.recv = {next, next + 1};
      s.recv_from = mod(r - 2, n);
    }
    steps.push_back(s);
  }
  return steps;
}

std::vector<ReduceScatterStep> ring_reduce_scatter(int n, int r) {
  FP8TRON_CHECK(n >= 1 && r >= 0 && r < n, "ring_reduce_scatter: bad rank");
  std::vector<ReduceScatterStep> steps(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ReduceScatterStep& s = steps[size_t(i)];
    s.gemm_dest = mod(r + i + 1, n);
    if (i >= 1) {
      s.send_to = mod(r + i, n);
      s.recv_from = mod(r - i, n);
    }
  }
  return steps;
}

std::vector<Range> even_splits(int64_t total, int parts) {
  FP8TRON_CHECK(parts >= 1 && total % parts == 0, strprintf("%lld does not split into %d equal parts", (long long)total, parts));
  std::vector<Range> out;
  const int64_t each = total / parts;
  for (int p = 0; p < parts; ++p) out.push_back({p * each, each});
  return out;
}

Range piece_rows(int64_t local_rows, int pieces, int chunk, int piece) {
  const int64_t each = local_rows / pieces;
  return {chunk * local_rows + piece * each, each};
}

}  // namespace fp8tron::overlap
