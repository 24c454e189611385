#include "models/recompute/activation_offload.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/StorageImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <optional>
#include <set>

#include "core/error.h"
#include "fp8/forward_replay.h"
#include "models/recompute/recompute.h"

namespace fp8tron {

// One offloaded storage: an alias keeps the storage (and so its identity) alive.
struct OffloadedStorage {
  torch::Tensor alias;
  size_t nbytes = 0;
  torch::Tensor host;  // uint8 [nbytes] while offloaded (pinned on CUDA)
};

// The copy streams of one device and the events ordering them against the compute stream.
struct CopyStreams {
  c10::cuda::CUDAStream d2h, h2d;
};

struct OffloadGroup {
  enum class State { kOnDevice, kOffloaded, kReloading };
  std::string module;
  std::vector<OffloadedStorage> storages;
  std::weak_ptr<OffloadGroup> earlier;  // the group before it in the same forward pass
  State state = State::kOnDevice;
  bool hooked = false;  // a reload waits on the gradient node of the module's output (else never offloaded)
  std::optional<CopyStreams> streams;   // CUDA only
  at::cuda::CUDAEvent offloaded, reloaded;
  // The offloader's storages held by live groups: this group's leave it when it is back on the
  // device or dies (its graph freed without a backward pass).
  std::shared_ptr<std::set<c10::StorageImpl*>> held;

  void let_go() {
    for (const auto& s : storages) held->erase(s.alias.storage().unsafeGetStorageImpl());
  }
  ~OffloadGroup() {
    if (held) let_go();
  }
};

struct ActivationOffloader::Impl {
  int64_t min_tensor_size = 0;
  std::weak_ptr<OffloadGroup> last;  // of the current forward pass
  std::vector<std::shared_ptr<OffloadGroup>> deferred;
  std::shared_ptr<std::set<c10::StorageImpl*>> held = std::make_shared<std::set<c10::StorageImpl*>>();
  std::optional<CopyStreams> streams;
  int64_t step_bytes = 0;
  std::map<std::string, int64_t> module_bytes;
};

namespace {
using torch::autograd::variable_list;

c10::StorageImpl* storage_of(const torch::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }

torch::Tensor bytes_of(const OffloadedStorage& s) {
  return at::from_blob(storage_of(s.alias)->mutable_data(), {int64_t(s.nbytes)},
                       at::TensorOptions().dtype(at::kByte).device(s.alias.device()));
}

// Starts the host-to-device copy: the storage gets device memory again (allocated on the compute
// stream, which owns it from now on) and the bytes come back on the copy stream.
void start_reload(OffloadGroup& g) {
  if (g.state != OffloadGroup::State::kOffloaded) return;
  for (auto& s : g.storages) {
    c10::StorageImpl* storage = storage_of(s.alias);
    storage->set_data_ptr_noswap(storage->allocator()->allocate(s.nbytes));
    storage->set_nbytes(s.nbytes);
  }
  if (!g.streams) {
    for (auto& s : g.storages) bytes_of(s).copy_(s.host);
  } else {
    const auto device = g.storages.front().alias.device();
    c10::cuda::CUDAGuard guard(device);
    // The new blocks may still be read by the compute stream's earlier work; the host bytes are
    // complete once the offload's copy is.
    at::cuda::CUDAEvent allocated;
    allocated.record(c10::cuda::getCurrentCUDAStream(device.index()));
    allocated.block(g.streams->h2d);
    g.offloaded.block(g.streams->h2d);
    c10::cuda::CUDAStreamGuard on_copy_stream(g.streams->h2d);
    for (auto& s : g.storages) {
      bytes_of(s).copy_(s.host, /*non_blocking=*/true);
      c10::cuda::CUDACachingAllocator::recordStream(storage_of(s.alias)->data_ptr(), g.streams->h2d);
    }
    g.reloaded.record(g.streams->h2d);
  }
  g.state = OffloadGroup::State::kReloading;
}

// The compute stream waits for the group's bytes; the host copies go.
void finish_reload(OffloadGroup& g) {
  if (g.state != OffloadGroup::State::kReloading) return;
  if (g.streams) {
    const auto device = g.storages.front().alias.device();
    g.reloaded.block(c10::cuda::getCurrentCUDAStream(device.index()));
  }
  for (auto& s : g.storages) s.host = torch::Tensor();
  g.state = OffloadGroup::State::kOnDevice;
}

// Before the module's output gradient node: its tensors back; the earlier group's copy starts so
// it overlaps this module's backward.
struct ReloadBeforeBackward : public torch::autograd::FunctionPreHook {
  explicit ReloadBeforeBackward(std::shared_ptr<OffloadGroup> g) : group(std::move(g)) {}
  variable_list operator()(const variable_list& grads) override {
    start_reload(*group);
    finish_reload(*group);
    group->let_go();
    if (auto earlier = group->earlier.lock()) start_reload(*earlier);
    return grads;
  }
  std::shared_ptr<OffloadGroup> group;
};

bool offloading_applies() {
  return torch::GradMode::is_enabled() && !recompute_first_pass_active() && !fp8::forward_replay_active();
}

}  // namespace

ActivationOffloader::ActivationOffloader(int64_t min_tensor_size) : impl_(std::make_unique<Impl>()) {
  impl_->min_tensor_size = min_tensor_size;
}
ActivationOffloader::~ActivationOffloader() = default;

void ActivationOffloader::begin_forward() {
  impl_->last.reset();
  impl_->deferred.clear();
}

std::shared_ptr<OffloadGroup> ActivationOffloader::begin(const std::string& module, const std::vector<torch::Tensor>& tensors,
                                                         const std::vector<torch::Tensor>& keep) {
  if (!offloading_applies()) return nullptr;
  std::set<c10::StorageImpl*> kept;
  for (const auto& t : keep)
    if (t.defined()) kept.insert(storage_of(t));
  auto g = std::make_shared<OffloadGroup>();
  g->module = module;
  std::set<c10::StorageImpl*> taken;
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() < impl_->min_tensor_size || (t.requires_grad() && t.is_leaf())) continue;
    c10::StorageImpl* s = storage_of(t);
    if (!s->allocator() || s->nbytes() == 0 || kept.count(s) || impl_->held->count(s) || !taken.insert(s).second) continue;
    g->storages.push_back({t.detach(), s->nbytes(), {}});
  }
  if (g->storages.empty()) return nullptr;
  for (auto* s : taken) impl_->held->insert(s);
  g->held = impl_->held;
  const auto device = g->storages.front().alias.device();
  if (device.is_cuda()) {
    if (!impl_->streams)
      impl_->streams = CopyStreams{c10::cuda::getStreamFromPool(false, device.index()), c10::cuda::getStreamFromPool(false, device.index())};
    g->streams = impl_->streams;
  }
  g->earlier = impl_->last;
  impl_->last = g;
  return g;
}

void ActivationOffloader::after(const std::shared_ptr<OffloadGroup>& group, const torch::Tensor& module_output) {
  if (!group) return;
  if (!module_output.grad_fn()) return;  // no gradient reaches the module: nothing would reload it
  group->hooked = true;
  // A tensor pre-hook runs before the node's other pre-hooks (an output-discarding recomputation's
  // replay may read the offloaded tensors).
  module_output.grad_fn()->add_tensor_pre_hook(std::make_unique<ReloadBeforeBackward>(group));
}

void ActivationOffloader::offload(const std::shared_ptr<OffloadGroup>& group) {
  if (!group || !group->hooked || group->state != OffloadGroup::State::kOnDevice) return;
  OffloadGroup& g = *group;
  if (!g.streams) {
    for (auto& s : g.storages) s.host = bytes_of(s).clone();
  } else {
    const auto device = g.storages.front().alias.device();
    c10::cuda::CUDAGuard guard(device);
    at::cuda::CUDAEvent written;  // the module's forward kernels wrote (and read) the tensors
    written.record(c10::cuda::getCurrentCUDAStream(device.index()));
    written.block(g.streams->d2h);
    c10::cuda::CUDAStreamGuard on_copy_stream(g.streams->d2h);
    for (auto& s : g.storages) {
      s.host = at::empty({int64_t(s.nbytes)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      s.host.copy_(bytes_of(s), /*non_blocking=*/true);
      // The block goes back to the allocator below; not reused before this copy read it.
      c10::cuda::CUDACachingAllocator::recordStream(storage_of(s.alias)->data_ptr(), g.streams->d2h);
    }
    g.offloaded.record(g.streams->d2h);
  }
  int64_t bytes = 0;
  for (auto& s : g.storages) {
    c10::StorageImpl* storage = storage_of(s.alias);
    storage->set_data_ptr_noswap(at::DataPtr(nullptr, s.alias.device()));
    storage->set_nbytes(0);
    bytes += int64_t(s.nbytes);
  }
  g.state = OffloadGroup::State::kOffloaded;
  impl_->step_bytes += bytes;
  impl_->module_bytes[g.module] += bytes;
}

void ActivationOffloader::defer(const std::shared_ptr<OffloadGroup>& group) {
  if (group) impl_->deferred.push_back(group);
}

void ActivationOffloader::offload_deferred() {
  if (!offloading_applies()) return;  // (a replay in backward: the list belongs to the forward pass)
  for (const auto& g : impl_->deferred) offload(g);
  impl_->deferred.clear();
}

torch::Tensor offloaded_call(ActivationOffloader* offloader, const std::string& name, const std::vector<torch::Tensor>& tensors,
                             const std::function<torch::Tensor()>& module, const std::vector<torch::Tensor>& keep) {
  if (!offloader) return module();
  auto group = offloader->begin(name, tensors, keep);
  auto out = module();
  offloader->after(group, out);
  offloader->offload(group);
  return out;
}

int64_t ActivationOffloader::take_offloaded_bytes() { return std::exchange(impl_->step_bytes, 0); }

std::map<std::string, int64_t> ActivationOffloader::bytes_by_module() const { return impl_->module_bytes; }

}  // namespace fp8tron
