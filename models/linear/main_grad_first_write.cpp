#include "models/linear/main_grad_first_write.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace fp8tron::main_grad_first_write {
namespace {

struct Entry {
  torch::Tensor param;
  const void* main_grad = nullptr;  // the `.grad` registered: a parameter given another gradient is not ours
  uint64_t written = 0;             // the step of its last write
  uint64_t zeroed = 0;              // the step in which zero_unwritten found it unwritten
};

struct Registry {
  std::mutex mutex;  // backward may run on autograd's device threads
  std::unordered_map<const c10::TensorImpl*, Entry> entries;
  uint64_t step = 1;
};

Registry& registry() {
  static Registry r;
  return r;
}
std::atomic<uint64_t> granted_count{0};
std::atomic<bool> enabled_flag{true};

}  // namespace

void own(const std::vector<torch::Tensor>& params) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.entries.clear();
  for (const auto& p : params) {
    TORCH_CHECK(p.grad().defined() && p.grad().scalar_type() == torch::kFloat32,
                "main_grad_first_write::own: a parameter without an fp32 main gradient");
    r.entries[p.unsafeGetTensorImpl()] = Entry{p, p.grad().data_ptr(), 0};
  }
}

void new_step() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  ++r.step;
}

bool take(const torch::Tensor& param) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.entries.find(param.unsafeGetTensorImpl());
  if (it == r.entries.end() || it->second.written == r.step) return false;
  const torch::Tensor g = param.grad();
  if (!g.defined() || g.data_ptr() != it->second.main_grad) return false;
  it->second.written = r.step;
  granted_count.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void zero_unwritten() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto& [impl, e] : r.entries)
    if (e.written != r.step || e.zeroed == r.step) {
      e.param.grad().zero_();
      e.written = e.zeroed = r.step;
    }
}

uint64_t granted() { return granted_count.load(std::memory_order_relaxed); }
void set_enabled(bool on) { enabled_flag.store(on, std::memory_order_relaxed); }
bool enabled() { return enabled_flag.load(std::memory_order_relaxed); }

}  // namespace fp8tron::main_grad_first_write
