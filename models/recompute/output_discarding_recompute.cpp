#include "models/recompute/output_discarding_recompute.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/utils.h>

#include "core/error.h"
#include "models/recompute/replay_state.h"

namespace fp8tron {
namespace {
using torch::autograd::variable_list;

bool shares_memory(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() && b.defined() && a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

// The output must own its memory: discarding it must not free an input's, another output's, or
// the rest of a larger tensor it is a view of.
torch::Tensor owning(const torch::Tensor& out, const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& before) {
  bool shared = out.storage_offset() != 0 || !out.is_contiguous() ||
                out.storage().nbytes() != size_t(out.numel()) * out.element_size();
  for (const auto& t : inputs) shared = shared || shares_memory(out, t);
  for (const auto& t : before) shared = shared || shares_memory(out, t);
  return shared ? out.clone(at::MemoryFormat::Contiguous) : out;
}

// Frees a tensor's memory (its storage keeps its identity, so every alias sees the refill).
void release_memory(const torch::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

// Gives a released tensor memory again and writes `value` into it, without a version bump (the
// consumer's saved copy of it must still unpack).
void refill(const torch::Tensor& t, size_t nbytes, const torch::Tensor& value) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
  at::from_blob(storage->mutable_data(), t.sizes(), t.strides(), t.options()).copy_(value.detach());
}

}  // namespace

struct OutputDiscardingRecompute::Node : public torch::autograd::Node {
  Fn fn;
  std::vector<torch::Tensor> saved;   // the detached inputs
  std::vector<int64_t> versions;      // of the inputs: an in-place change before backward is an error
  std::vector<bool> wants_grad;
  RngSnapshot rng;
  std::vector<torch::Tensor> outputs;  // aliases of the outputs handed out
  std::vector<size_t> released;        // bytes of each released output (0: kept)
  std::vector<torch::Tensor> inputs, replayed;  // the replay's

  std::string name() const override { return "OutputDiscardingRecomputeBackward"; }
  void release_variables() override {
    saved.clear();
    outputs.clear();
    inputs.clear();
    replayed.clear();
    fn = nullptr;
  }

  // Runs the function again (once) and writes its outputs into the released memory.
  void replay() {
    if (!replayed.empty()) return;
    FP8TRON_CHECK(fn != nullptr, "an output-discarding recomputation replayed after its backward ran");
    for (size_t i = 0; i < saved.size(); ++i)
      FP8TRON_CHECK(!saved[i].defined() || int64_t(saved[i]._version()) == versions[i],
                    "an input of a recomputed function was modified in place before the backward pass");
    inputs = saved;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined()) inputs[i] = inputs[i].detach().requires_grad_(wants_grad[i]);
    {
      ReplayScope scope(rng);
      replayed = fn(inputs);
    }
    FP8TRON_CHECK(replayed.size() == outputs.size(), "a recomputed function returned another number of outputs");
    for (size_t i = 0; i < outputs.size(); ++i)
      if (released[i]) refill(outputs[i], released[i], replayed[i]);
  }

  variable_list apply(variable_list&& grads) override {
    replay();
    std::vector<torch::Tensor> outs, out_grads;
    for (size_t i = 0; i < replayed.size(); ++i)
      if (i < grads.size() && grads[i].defined() && replayed[i].requires_grad()) {
        outs.push_back(replayed[i]);
        out_grads.push_back(grads[i]);
      }
    if (!outs.empty()) torch::autograd::backward(outs, out_grads);
    variable_list result(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (wants_grad[i]) result[i] = inputs[i].grad();
    release_variables();
    return result;
  }
};

namespace {
// Before the consumer's gradient node runs: the outputs it saved are recomputed.
struct ReplayBeforeConsumer : public torch::autograd::FunctionPreHook {
  explicit ReplayBeforeConsumer(std::shared_ptr<OutputDiscardingRecompute::Node> n) : node(std::move(n)) {}
  variable_list operator()(const variable_list& grads) override {
    node->replay();
    return grads;
  }
  std::shared_ptr<OutputDiscardingRecompute::Node> node;
};
}  // namespace

std::vector<torch::Tensor> OutputDiscardingRecompute::run(const Fn& fn, const std::vector<torch::Tensor>& inputs) {
  node_.reset();
  if (!torch::GradMode::is_enabled()) return fn(inputs);
  FP8TRON_CHECK(!inputs.empty() && inputs[0].defined(), "recompute: the first input must be a tensor");
  auto node = std::shared_ptr<Node>(new Node(), torch::autograd::deleteNode);
  node->rng = RngSnapshot::capture(inputs[0].device());
  std::vector<torch::Tensor> detached = detached_like(inputs);
  std::vector<torch::Tensor> outs;
  {
    // The graph this builds dies at the end of the scope (only the values are kept).
    FirstPassGuard first(true);
    const std::vector<torch::Tensor> recorded = fn(detached);
    torch::NoGradGuard no_grad;
    for (const auto& r : recorded) {
      auto out = owning(r.detach(), detached, outs);
      outs.push_back(at::_unsafe_view(out, out.sizes()));  // not a view: autograd attaches the node to it
    }
  }
  node->fn = fn;
  for (const auto& t : inputs) node->wants_grad.push_back(t.defined() && t.requires_grad());
  for (auto& t : detached)
    if (t.defined()) t = t.detach();
  node->saved = std::move(detached);
  for (const auto& t : node->saved) node->versions.push_back(t.defined() ? int64_t(t._version()) : 0);
  torch::autograd::edge_list edges;
  for (const auto& t : inputs) edges.push_back(t.defined() ? torch::autograd::impl::gradient_edge(t) : torch::autograd::Edge());
  node->set_next_edges(std::move(edges));
  for (auto& out : outs) {
    torch::autograd::set_history(out, node);
    node->outputs.push_back(out.detach());
  }
  node->released.assign(outs.size(), 0);
  node_ = node;
  return outs;
}

torch::Tensor OutputDiscardingRecompute::run_one(const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                                                 const torch::Tensor& input) {
  return run([fn](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{fn(in[0])}; }, {input})[0];
}

void OutputDiscardingRecompute::discard(const torch::Tensor& consumer_output) {
  auto node = std::move(node_);
  if (!node || !consumer_output.grad_fn()) return;
  for (size_t i = 0; i < node->outputs.size(); ++i) {
    const auto& out = node->outputs[i];
    if (!out.storage().unsafeGetStorageImpl()->allocator()) continue;  // memory it cannot allocate again: kept
    node->released[i] = out.storage().nbytes();
    release_memory(out);
  }
  consumer_output.grad_fn()->add_pre_hook(std::make_unique<ReplayBeforeConsumer>(node));
}

}  // namespace fp8tron
