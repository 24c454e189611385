#include "trainer/weight_hash_check.h"

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {
int64_t fnv1a(const torch::Tensor& t) {
  auto bytes = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  const auto* p = static_cast<const unsigned char*>(bytes.data_ptr());
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int64_t i = 0; i < bytes.numel() * int64_t(sizeof(float)); ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return int64_t(h);
}

// Throws naming the first parameter whose hash differs between replicas of `group`.
void compare_over(const std::vector<std::pair<std::string, torch::Tensor>>& params, Communicator& group, int64_t iteration) {
  const int n = group.size();
  std::vector<int64_t> mine;
  for (const auto& [name, t] : params) mine.push_back(fnv1a(t));
  if (n == 1 || mine.empty()) return;
  const auto device = params.front().second.device();
  auto local = torch::tensor(mine, torch::kInt64).to(device);
  auto all = torch::empty({n * local.numel()}, local.options());
  group.all_gather(all, local);
  all = all.cpu().view({n, local.numel()});
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < mine.size(); ++i)
      if (all[r][int64_t(i)].item<int64_t>() != mine[i])
        throw UserError(strprintf("Parameter hashes not matching across DP replicas (--check-weight-hash-across-dp-replicas-"
                                  "interval): %s differs between data-parallel ranks %d and %d after %lld iterations",
                                  params[i].first.c_str(), group.rank(), r, (long long)iteration));
}
}  // namespace

std::string check_weight_hashes(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                                const std::vector<std::pair<std::string, torch::Tensor>>& expert_params,
                                const ParallelState& parallel, int64_t iteration) {
  compare_over(params, *parallel.dp, iteration);
  if (!expert_params.empty()) compare_over(expert_params, *parallel.expert_dp, iteration);
  return strprintf(">>> Weight hashes match after %lld iterations...", (long long)iteration);
}

}  // namespace fp8tron
