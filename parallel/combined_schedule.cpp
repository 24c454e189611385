#include "parallel/combined_schedule.h"

#include <map>

#include "core/error.h"

namespace fp8tron {

std::vector<CombinedSlot> combined_1f1b_order(int64_t n) {
  std::vector<CombinedSlot> order;
  if (n <= 0) return order;
  order.push_back({-1, 0});
  for (int64_t mb = 1; mb < n; ++mb) order.push_back({mb - 1, mb});
  order.push_back({n - 1, -1});
  return order;
}

torch::Tensor run_combined_1f1b(int64_t n, const std::function<torch::Tensor(int64_t)>& forward, double loss_scale,
                                const std::function<void()>& before_last_backward, AllToAllTurns& turns,
                                torch::Device device, const std::function<void()>& after_backward) {
  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  std::map<int64_t, torch::Tensor> losses;  // forward done, backward pending
  auto run_forward = [&](int64_t mb) {
    auto loss = forward(mb);
    loss_sum += loss.detach().to(torch::kFloat32);
    losses[mb] = loss;
  };
  // A pair's backward loss leaves the map before the pair starts: its forward side inserts into it.
  auto take_loss = [&](int64_t mb) {
    auto node = losses.extract(mb);
    FP8TRON_CHECK(!node.empty(), "backward before forward in the combined 1F1B schedule");
    return node.mapped();
  };
  for (const CombinedSlot& slot : combined_1f1b_order(n)) {
    // The map is touched by one side at a time (the turns), and never during the other's compute.
    if (slot.backward == n - 1 && before_last_backward) before_last_backward();
    if (slot.backward < 0) {
      run_forward(slot.forward);
      continue;
    }
    const torch::Tensor loss = take_loss(slot.backward);
    auto run_backward = [&] {
      (loss * loss_scale).backward();
      if (after_backward) after_backward();
    };
    if (slot.forward < 0) run_backward();
    else turns.run_pair(run_backward, [&] { run_forward(slot.forward); }, device);
  }
  return loss_sum;
}

}  // namespace fp8tron
