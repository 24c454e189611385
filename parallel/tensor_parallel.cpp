#include "parallel/tensor_parallel.h"

#include "core/error.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Autograd contexts hold the group as an opaque pointer: groups outlive every graph.
void save_comm(AutogradContext* ctx, Communicator& comm) { ctx->saved_data["comm"] = int64_t(reinterpret_cast<intptr_t>(&comm)); }
Communicator& load_comm(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(intptr_t(ctx->saved_data["comm"].toInt()));
}

torch::Tensor all_reduced(const torch::Tensor& x, Communicator& comm) {
  auto out = x.contiguous().clone();
  comm.all_reduce(out);
  return out;
}
torch::Tensor gathered(const torch::Tensor& x, Communicator& comm) {
  auto in = x.contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] *= comm.size();
  auto out = torch::empty(sizes, in.options());
  comm.all_gather(out, in);
  return out;
}
torch::Tensor reduce_scattered(const torch::Tensor& x, Communicator& comm) {
  auto in = x.contiguous();
  FP8TRON_CHECK(in.size(0) % comm.size() == 0, "sequence length must be divisible by the tensor-parallel size");
  auto sizes = in.sizes().vec();
  sizes[0] /= comm.size();
  auto out = torch::empty(sizes, in.options());
  comm.reduce_scatter(out, in);
  return out;
}
torch::Tensor own_chunk(const torch::Tensor& x, Communicator& comm) {
  FP8TRON_CHECK(x.size(0) % comm.size() == 0, "sequence length must be divisible by the tensor-parallel size");
  const int64_t n = x.size(0) / comm.size();
  return x.narrow(0, n * comm.rank(), n).contiguous();
}

struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* comm) {
    save_comm(ctx, *comm);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) { return {all_reduced(g[0], load_comm(ctx)), {}}; }
};
struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, Communicator* comm) { return all_reduced(x, *comm); }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], {}}; }
};
struct GatherFromSp : torch::autograd::Function<GatherFromSp> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* comm) {
    save_comm(ctx, *comm);
    return gathered(x, *comm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) { return {reduce_scattered(g[0], load_comm(ctx)), {}}; }
};
struct ReduceScatterToSp : torch::autograd::Function<ReduceScatterToSp> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* comm) {
    save_comm(ctx, *comm);
    return reduce_scattered(x, *comm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) { return {gathered(g[0], load_comm(ctx)), {}}; }
};
struct ScatterToSp : torch::autograd::Function<ScatterToSp> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* comm) {
    save_comm(ctx, *comm);
    return own_chunk(x, *comm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) { return {gathered(g[0], load_comm(ctx)), {}}; }
};

// All-gather along the last (feature) dimension; backward keeps this rank's slice (Megatron's
// gather_from_tensor_model_parallel_region).
struct GatherFromTpLastDim : torch::autograd::Function<GatherFromTpLastDim> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* comm) {
    save_comm(ctx, *comm);
    return gathered(x.movedim(-1, 0), *comm).movedim(0, -1).contiguous();
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    Communicator& comm = load_comm(ctx);
    const int64_t n = g[0].size(-1) / comm.size();
    return {g[0].narrow(-1, n * comm.rank(), n).contiguous(), {}};
  }
};

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits_in, const torch::Tensor& target,
                               int64_t vocab_start, Communicator* comm) {
    auto logits = logits_in.to(torch::kFloat32);
    const int64_t shard = logits.size(-1);
    // Subtract the global maximum for stability.
    auto max = std::get<0>(logits.max(-1));
    comm->all_reduce(max, ReduceOp::Max);
    logits = logits - max.unsqueeze(-1);
    // The target's logit lives on exactly one shard.
    auto outside = (target < vocab_start).logical_or(target >= vocab_start + shard);
    auto local_target = (target - vocab_start).masked_fill(outside, 0);
    auto predicted = logits.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0).contiguous();
    comm->all_reduce(predicted);
    auto exp = logits.exp_();
    auto sum_exp = exp.sum(-1).contiguous();
    comm->all_reduce(sum_exp);
    auto loss = sum_exp.log() - predicted;
    exp.div_(sum_exp.unsqueeze(-1));  // softmax, kept for backward
    ctx->save_for_backward({exp, local_target, outside});
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto saved = ctx->get_saved_variables();
    auto grad = saved[0].clone();  // d loss / d logits = softmax - onehot(target)
    auto hit = 1.0 - saved[2].to(torch::kFloat32);
    grad.scatter_add_(-1, saved[1].unsqueeze(-1), -hit.unsqueeze(-1));
    grad.mul_(g[0].unsqueeze(-1));
    return {grad, {}, {}, {}};
  }
};

}  // namespace

torch::Tensor copy_to_tp(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : CopyToTp::apply(x, &tp);
}
torch::Tensor gather_from_tp_last_dim(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : GatherFromTpLastDim::apply(x, &tp);
}
torch::Tensor reduce_from_tp(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : ReduceFromTp::apply(x, &tp);
}
torch::Tensor gather_from_sp(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : GatherFromSp::apply(x, &tp);
}
torch::Tensor reduce_scatter_to_sp(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : ReduceScatterToSp::apply(x, &tp);
}
torch::Tensor scatter_to_sp(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : ScatterToSp::apply(x, &tp);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target, int64_t vocab_start,
                                           Communicator& tp) {
  return VocabParallelCrossEntropy::apply(logits, target, vocab_start, &tp);
}

torch::Tensor vocab_parallel_embedding(const torch::Tensor& tokens, const torch::Tensor& weight, int64_t vocab_start,
                                       Communicator& tp) {
  if (tp.size() == 1) return torch::nn::functional::embedding(tokens, weight);
  auto outside = (tokens < vocab_start).logical_or(tokens >= vocab_start + weight.size(0));
  auto local = (tokens - vocab_start).masked_fill(outside, 0);
  auto out = torch::nn::functional::embedding(local, weight).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_from_tp(out, tp);
}

}  // namespace fp8tron
