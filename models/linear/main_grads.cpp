#include "models/linear/main_grads.h"

#include "models/linear/linear_grads.h"

namespace fp8tron {

bool MainGrads::fuses_into(const torch::Tensor& param) const { return fusion_ && is_main_grad(param); }

void MainGrads::own(const std::vector<torch::Tensor>& params) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
  for (const auto& p : params) {
    TORCH_CHECK(p.grad().defined() && p.grad().scalar_type() == torch::kFloat32,
                "MainGrads::own: a parameter without an fp32 main gradient");
    entries_[p.unsafeGetTensorImpl()] = Entry{p, p.grad().data_ptr(), 0};
  }
}

void MainGrads::new_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++step_;
}

bool MainGrads::take(const torch::Tensor& param) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = entries_.find(param.unsafeGetTensorImpl());
  if (it == entries_.end() || it->second.written == step_) return false;
  const torch::Tensor g = param.grad();
  if (!g.defined() || g.data_ptr() != it->second.main_grad) return false;
  it->second.written = step_;
  ++granted_;
  return true;
}

void MainGrads::zero_unwritten() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [impl, e] : entries_)
    if (e.written != step_ || e.zeroed == step_) {
      e.param.grad().zero_();
      e.written = e.zeroed = step_;
    }
}

void MainGrads::hold_wgrad_of(const torch::Tensor& param) {
  if (!wgrad_queue_ || !param.defined()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (delayed_keys_.insert(param.unsafeGetTensorImpl()).second) delayed_.push_back(param);
}

bool MainGrads::delays_wgrad_of(const torch::Tensor& param) const {
  if (!wgrad_queue_ || !param.defined()) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  return delayed_keys_.count(param.unsafeGetTensorImpl()) > 0;
}

std::shared_ptr<DeferredWork> MainGrads::wgrad_queue_for(const torch::Tensor& weight) const {
  if (!torch::GradMode::is_enabled() || !weight.requires_grad() || !weight.is_leaf() || !delays_wgrad_of(weight))
    return nullptr;
  return wgrad_queue_;
}

std::vector<torch::Tensor> MainGrads::delayed_params() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return delayed_;
}

uint64_t MainGrads::granted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return granted_;
}

}  // namespace fp8tron
