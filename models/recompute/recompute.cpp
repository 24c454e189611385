#include "models/recompute/recompute.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include "core/error.h"
#include "models/recompute/replay_state.h"

namespace fp8tron {
namespace {

using torch::autograd::variable_list;

// --distribute-saved-activations: this rank's 1/size of the flattened tensor (zero-padded to a
// multiple of the group size), and the whole tensor back from the parts.
torch::Tensor own_part(const torch::Tensor& x, const Communicator& group) {
  const int64_t n = x.numel(), size = group.size(), part = (n + size - 1) / size;
  auto flat = x.detach().reshape({-1});
  if (part * size != n) flat = torch::cat({flat, torch::zeros({part * size - n}, flat.options())});
  return flat.narrow(0, part * group.rank(), part).clone();
}
torch::Tensor whole_from_parts(const torch::Tensor& part, Communicator& group, at::IntArrayRef shape) {
  auto gathered = torch::empty({part.numel() * group.size()}, part.options());
  group.all_gather(gathered, part);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return gathered.narrow(0, 0, n).view(shape);
}

struct RecomputeBackward : public torch::autograd::Node {
  RecomputeFn fn;
  std::vector<torch::Tensor> saved;  // detached inputs; the first one possibly this rank's part
  std::vector<int64_t> versions;     // of the inputs: an in-place change before backward is an error
  std::vector<bool> wants_grad;
  RngSnapshot rng;
  Communicator* distributed = nullptr;
  std::vector<int64_t> first_shape;

  std::string name() const override { return "RecomputeBackward"; }
  void release_variables() override {
    saved.clear();
    fn = nullptr;
  }

  variable_list apply(variable_list&& grads) override {
    FP8TRON_CHECK(fn != nullptr, "RecomputeBackward ran twice (retain_graph is not supported with recomputation)");
    for (size_t i = 0; i < saved.size(); ++i)
      FP8TRON_CHECK(!saved[i].defined() || int64_t(saved[i]._version()) == versions[i],
                    "an input of a recomputed function was modified in place before the backward pass");
    std::vector<torch::Tensor> inputs = saved;
    if (distributed) inputs[0] = whole_from_parts(inputs[0], *distributed, first_shape);
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined()) inputs[i] = inputs[i].detach().requires_grad_(wants_grad[i]);
    torch::Tensor out;
    {
      ReplayScope replay(rng);
      out = fn(inputs);
    }
    if (out.requires_grad() && grads[0].defined()) torch::autograd::backward({out}, {grads[0]});
    variable_list result(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (wants_grad[i]) result[i] = inputs[i].grad();
    release_variables();
    return result;
  }
};

}  // namespace

torch::Tensor recompute(const RecomputeFn& fn, const std::vector<torch::Tensor>& inputs, const RecomputeOptions& options) {
  if (!torch::GradMode::is_enabled()) return fn(inputs);
  FP8TRON_CHECK(!inputs.empty() && inputs[0].defined(), "recompute: the first input must be a tensor");
  auto node = std::shared_ptr<RecomputeBackward>(new RecomputeBackward(), torch::autograd::deleteNode);
  node->rng = RngSnapshot::capture(inputs[0].device());
  std::vector<torch::Tensor> detached = detached_like(inputs);
  torch::Tensor y;
  {
    // The graph this builds dies with `recorded` at the end of the scope (see the header).
    FirstPassGuard first(true);
    const torch::Tensor recorded = fn(detached);
    torch::NoGradGuard no_grad;
    // Not a view: autograd attaches the node to y as to any function's fresh output.
    y = at::_unsafe_view(recorded.detach(), recorded.sizes());
  }
  node->fn = fn;
  for (const auto& t : inputs) node->wants_grad.push_back(t.defined() && t.requires_grad());
  for (auto& t : detached)
    if (t.defined()) t = t.detach();
  node->saved = std::move(detached);
  if (options.distribute_over && options.distribute_over->size() > 1) {
    node->distributed = options.distribute_over;
    node->first_shape = inputs[0].sizes().vec();
    node->saved[0] = own_part(inputs[0], *options.distribute_over);
  }
  for (const auto& t : node->saved) node->versions.push_back(t.defined() ? int64_t(t._version()) : 0);
  torch::autograd::edge_list edges;
  for (const auto& t : inputs) edges.push_back(t.defined() ? torch::autograd::impl::gradient_edge(t) : torch::autograd::Edge());
  node->set_next_edges(std::move(edges));
  torch::autograd::set_history(y, node);
  return y;
}

std::vector<LayerUnit> layer_units(const RecomputeConfig& c, int64_t layers) {
  std::vector<LayerUnit> units;
  if (!c.full() || layers == 0) {
    if (layers > 0) units.push_back({0, layers, false});
    return units;
  }
  FP8TRON_CHECK(c.num_layers >= 1, "--recompute-num-layers must be at least 1");
  if (c.method == RecomputeMethod::Uniform) {
    for (int64_t begin = 0; begin < layers; begin += c.num_layers)
      units.push_back({begin, std::min(layers, begin + c.num_layers), true});
    return units;
  }
  FP8TRON_CHECK(c.method == RecomputeMethod::Block, "full recomputation needs --recompute-method uniform or block");
  const int64_t recomputed = std::min(layers, c.num_layers);
  for (int64_t i = 0; i < recomputed; ++i) units.push_back({i, i + 1, true});
  if (recomputed < layers) units.push_back({recomputed, layers, false});
  return units;
}

}  // namespace fp8tron
