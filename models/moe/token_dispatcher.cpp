#include "models/moe/token_dispatcher.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include "core/error.h"
#include "core/text.h"
#include "fp8/packed_rows.h"
#include "models/moe/routing.h"
#include "parallel/moe_comm.h"

namespace fp8tron {
namespace {

int64_t sum(const std::vector<int64_t>& v) {
  int64_t n = 0;
  for (int64_t x : v) n += x;
  return n;
}

class AllGatherDispatcher : public TokenDispatcher {
 public:
  using TokenDispatcher::TokenDispatcher;

  DispatchedTokens dispatch(const torch::Tensor& x, const moe::Routing& routing) override {
    input_dtype_ = x.scalar_type();
    time("moe-token-dispatch", true);
    const torch::Tensor& probs = routing.probs;
    const torch::Tensor& map = routing.map;
    Communicator& group = *options_.groups.expert_tp_ep;
    // Every rank of the group sees all of the group's tokens (group-rank order).
    auto all_x = gather_rows(x, group);
    auto all_probs = gather_rows(probs, group);
    auto all_map = all_gather_no_grad(map.to(torch::kUInt8), group).to(torch::kBool);
    const int64_t first = options_.groups.ep_rank * options_.num_local_experts, local = options_.num_local_experts;
    auto local_map = all_map.narrow(1, first, local);
    local_probs_ = all_probs.narrow(1, first, local);
    const auto counts = to_host(local_map.sum(0));
    index_ = moe::make_permute_index(local_map, counts);
    DispatchedTokens out{moe::permute(all_x, index_), counts, {}};
    time("moe-token-dispatch", false);
    return out;
  }

  torch::Tensor combine(const torch::Tensor& y) override {
    // The weighted sum in the probs' dtype (fp32 with --moe-router-dtype fp32), reduced over the
    // group in it (summing the expert-TP partial sums and the other ranks' experts), then cast.
    time("moe-token-combine", true);
    auto out = moe::unpermute(y, index_, local_probs_, local_probs_.scalar_type());
    out = reduce_scatter_rows(out, *options_.groups.expert_tp_ep).to(input_dtype_);
    index_ = {};
    local_probs_ = torch::Tensor();
    time("moe-token-combine", false);
    return out;
  }

 private:
  moe::PermuteIndex index_;
  torch::Tensor local_probs_;
};

// The backward of the FP8 dispatch (--moe-dispatch-fp8): the bf16 dispatch's backward, step for
// step, on the gradient in the activations' dtype (each forward step's partner collective, as the
// autograd functions of moe_comm.h and permute.h run them): regroup by source, reduce-scatter over
// expert TP, the reverse all-to-all, and each token summing its rows' gradients.
struct Fp8DispatchBackward : public torch::autograd::Node {
  moe::PermuteIndex index;
  Communicator* ep = nullptr;
  Communicator* expert_tp = nullptr;
  int64_t local_experts = 1;
  std::vector<int64_t> input_splits, output_splits, output_splits_tp, regrouped_sizes, by_source;

  std::string name() const override { return "Fp8DispatchBackward"; }
  void release_variables() override { index = {}; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return {torch::Tensor()};
    torch::NoGradGuard no_grad;
    auto g = grads[0];
    if (local_experts > 1) g = moe::sort_chunks(g, regrouped_sizes, by_source);
    if (expert_tp->size() > 1) g = reduce_scatter_rows_v(g, *expert_tp, output_splits_tp);
    g = all_to_all_rows(g, *ep, output_splits, input_splits);
    return {moe::unpermute(g, index, torch::Tensor(), g.scalar_type())};
  }
};

class AllToAllDispatcher : public TokenDispatcher {
 public:
  using TokenDispatcher::TokenDispatcher;

  DispatchedTokens dispatch(const torch::Tensor& x, const moe::Routing& routing) override {
    input_dtype_ = x.scalar_type();
    time("moe-token-dispatch", true);
    probs_ = routing.probs;
    plan(routing.map, routing.counts);
    // With --moe-router-padding-for-quantization the index pads each expert's rows (the map stays
    // as routed; the padding tokens' probabilities are zero).
    index_ = moe::make_permute_index(routing.map, routed_counts_, options_.pad_multiple);
    if (options_.fp8_dispatch) {
      auto out = dispatch_fp8(x);
      time("moe-token-dispatch", false);
      return out;
    }
    auto rows = moe::permute(x, index_);  // by global expert: contiguous per destination EP rank
    int64_t bytes = 0;
    rows = all_to_all_rows(rows, *options_.groups.ep, input_splits_, output_splits_, &bytes);
    if (options_.context) options_.context->add_dispatch_bytes(bytes);
    if (options_.groups.expert_tp->size() > 1) rows = all_gather_rows_v(rows, *options_.groups.expert_tp, output_splits_tp_);
    if (options_.num_local_experts > 1) rows = moe::sort_chunks(rows, chunk_sizes_, by_expert_);
    time("moe-token-dispatch", false);
    return DispatchedTokens{rows, tokens_per_expert_, {}};
  }

  // --moe-dispatch-fp8: every token quantized once, before the permutation copies it to its
  // experts, into packed rows of codes and scales; the bf16 path's row operations on those bytes;
  // the values of the received codes as the experts' differentiable input (one autograd node for
  // the whole exchange, whose backward is the bf16 path's).
  DispatchedTokens dispatch_fp8(const torch::Tensor& x) {
    fp8::Fp8Engine& engine = *options_.fp8_dispatch;
    const auto& g = options_.groups;
    torch::Tensor packed;
    int64_t bytes = 0;
    {
      torch::NoGradGuard no_grad;
      packed = moe::permute(fp8::quantize_packed_rows(engine, x), index_);
      packed = all_to_all_rows(packed, *g.ep, input_splits_, output_splits_, &bytes);
      if (g.expert_tp->size() > 1) packed = all_gather_rows_v(packed, *g.expert_tp, output_splits_tp_);
      if (options_.num_local_experts > 1) packed = moe::sort_chunks(packed, chunk_sizes_, by_expert_);
    }
    if (options_.context) options_.context->add_dispatch_bytes(bytes);
    // The values the received codes stand for, in x's dtype, as a tensor of its own (not a view of
    // the padded dequantized copy) that the node below can own.
    auto values = fp8::dequantize_packed_rows(engine, packed, x.size(1)).to(x.scalar_type()).detach();
    if (torch::GradMode::is_enabled() && x.requires_grad()) {
      auto node = std::shared_ptr<Fp8DispatchBackward>(new Fp8DispatchBackward(), torch::autograd::deleteNode);
      node->index = index_;
      node->ep = g.ep.get();
      node->expert_tp = g.expert_tp.get();
      node->local_experts = options_.num_local_experts;
      node->input_splits = input_splits_;
      node->output_splits = output_splits_;
      node->output_splits_tp = output_splits_tp_;
      node->regrouped_sizes = regrouped_sizes_;
      node->by_source = by_source_;
      node->set_next_edges(torch::autograd::collect_next_edges(x));
      torch::autograd::set_history(values, node);
    }
    return DispatchedTokens{values, tokens_per_expert_, packed};
  }

  torch::Tensor combine(const torch::Tensor& y_in) override {
    time("moe-token-combine", true);
    auto y = y_in;
    if (options_.num_local_experts > 1) y = moe::sort_chunks(y, regrouped_sizes_, by_source_);
    // Completes the row-parallel fc2's partial sums and keeps the rows this rank received.
    if (options_.groups.expert_tp->size() > 1) y = reduce_scatter_rows_v(y, *options_.groups.expert_tp, output_splits_tp_);
    y = all_to_all_rows(y, *options_.groups.ep, output_splits_, input_splits_);
    auto out = moe::unpermute(y, index_, probs_, input_dtype_);
    index_ = {};
    probs_ = torch::Tensor();
    time("moe-token-combine", false);
    return out;
  }

 private:
  // Token counts of the whole expert tensor x expert parallel group, gathered on the device and
  // copied to the host once; every split below derives from them.
  void plan(const torch::Tensor& map, const torch::Tensor& known_counts) {
    const auto& g = options_.groups;
    const int64_t experts = options_.num_experts, local = options_.num_local_experts;
    const int ep = g.ep->size(), etp = g.expert_tp->size();
    auto local_counts = known_counts.defined() ? known_counts : map.sum(0);  // [E] int64 on the device
    auto gathered = to_host(all_gather_no_grad(local_counts.unsqueeze(0), *g.expert_tp_ep).reshape({-1}));
    // The expert grid puts etp fastest: group rank j = ep_source * ETP + etp_source. Rows are counted
    // after the padding for quantization, which every source applies to its own counts.
    auto routed = [&](int etp_source, int ep_source, int64_t expert) {
      return gathered[size_t((int64_t(ep_source) * etp + etp_source) * experts + expert)];
    };
    auto count = [&](int etp_source, int ep_source, int64_t expert) {
      return moe::padded_count(routed(etp_source, ep_source, expert), options_.pad_multiple);
    };
    const int me = g.expert_tp_rank;
    const int64_t tokens = map.size(0);
    routed_counts_.assign(size_t(experts), 0);
    for (int64_t e = 0; e < experts; ++e) routed_counts_[size_t(e)] = routed(me, g.ep_rank, e);
    // Every rank checks every source's counts (all ranks route micro-batches of the same size), so
    // all of them stop together instead of some waiting in the all-to-all.
    if (options_.pad_multiple > 0)
      for (size_t j = 0; j < gathered.size(); ++j)
        if (moe::padded_count(gathered[j], options_.pad_multiple) > tokens)
          throw UserError(strprintf("--moe-router-padding-for-quantization: expert %lld on rank %lld of the expert-parallel group "
                                    "would need more padding tokens than that rank routes elsewhere (%lld tokens, "
                                    "multiple of %lld); use a larger micro-batch or let the experts pad (drop the flag)",
                                    (long long)(int64_t(j) % experts), (long long)(int64_t(j) / experts),
                                    (long long)gathered[j], (long long)options_.pad_multiple));
    const int64_t first = int64_t(g.ep_rank) * local;
    input_splits_.assign(size_t(ep), 0);
    for (int r = 0; r < ep; ++r)
      for (int64_t l = 0; l < local; ++l) input_splits_[size_t(r)] += count(me, g.ep_rank, r * local + l);
    // Rows each (etp, ep) source sends to each local expert.
    output_splits_.assign(size_t(ep), 0);
    output_splits_tp_.assign(size_t(etp), 0);
    tokens_per_expert_.assign(size_t(local), 0);
    chunk_sizes_.clear();
    for (int t = 0; t < etp; ++t)
      for (int r = 0; r < ep; ++r)
        for (int64_t l = 0; l < local; ++l) {
          const int64_t n = count(t, r, first + l);
          if (t == me) output_splits_[size_t(r)] += n;
          output_splits_tp_[size_t(t)] += n;
          tokens_per_expert_[size_t(l)] += n;
          chunk_sizes_.push_back(n);  // chunk id (t * ep + r) * local + l
        }
    // Regroup by local expert: for each l, the chunks of every source in (etp, ep) order.
    const int64_t sources = int64_t(etp) * ep;
    by_expert_.clear();
    regrouped_sizes_.clear();
    for (int64_t l = 0; l < local; ++l)
      for (int64_t s = 0; s < sources; ++s) {
        by_expert_.push_back(s * local + l);
        regrouped_sizes_.push_back(chunk_sizes_[size_t(s * local + l)]);
      }
    by_source_.assign(by_expert_.size(), 0);
    for (size_t i = 0; i < by_expert_.size(); ++i) by_source_[size_t(by_expert_[i])] = int64_t(i);
    FP8TRON_CHECK(sum(tokens_per_expert_) == sum(output_splits_tp_), "all-to-all dispatcher: inconsistent counts");
  }

  torch::Tensor probs_;
  moe::PermuteIndex index_;
  std::vector<int64_t> routed_counts_, input_splits_, output_splits_, output_splits_tp_, tokens_per_expert_;
  std::vector<int64_t> chunk_sizes_, by_expert_, regrouped_sizes_, by_source_;
};

}  // namespace

std::vector<int64_t> to_host(const torch::Tensor& counts) {
  auto host = counts.to(torch::kCPU, torch::kInt64).contiguous();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

std::unique_ptr<TokenDispatcher> make_token_dispatcher(MoeDispatcher kind, DispatcherOptions options) {
  if (kind == MoeDispatcher::kAllToAll) return std::make_unique<AllToAllDispatcher>(std::move(options));
  return std::make_unique<AllGatherDispatcher>(std::move(options));
}

}  // namespace fp8tron
