#include "parallel/overlap/tp_linear.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::overlap {
namespace {

using torch::autograd::variable_list;
using WorkList = std::vector<std::unique_ptr<CommWork>>;

// A gathered row block and where it sits in the gathered tensor.
struct Block {
  int64_t first_row = 0;
  Operand op;
};
using Consume = std::function<void(const Block&)>;
// Fills out [rows.count, cols.count] with a part of the partial output.
using Produce = std::function<void(Range rows, Range cols, torch::Tensor& out)>;

bool is_ring(const GemmOverlap& o) { return o.method == OverlapMethod::kRingExchange; }
bool is_pipeline(const GemmOverlap& o) { return o.method == OverlapMethod::kPipeline; }

std::vector<torch::Tensor> empty_like_wire(const Operand& op) {
  std::vector<torch::Tensor> out;
  for (const auto& t : op.wire) out.push_back(torch::empty_like(t, at::MemoryFormat::Contiguous));
  return out;
}

// ---- all-gathers feeding a GEMM ------------------------------------------------------------------

// Issues the all-gather of every wire tensor of `op` into [n, ...] buffers (not waited).
WorkList post_gather(Communicator& comm, const Operand& op, std::vector<torch::Tensor>& gathered) {
  WorkList works;
  for (const auto& t : op.wire) {
    std::vector<int64_t> sizes = {int64_t(comm.size())};
    for (int64_t s : t.sizes()) sizes.push_back(s);
    auto out = torch::empty(sizes, t.options());
    auto in = t.contiguous();
    works.push_back(comm.all_gather_async(out, in));
    gathered.push_back(out);
  }
  return works;
}

// The blocks of a finished post_gather, rank by rank (this rank's own block is `local`).
std::vector<Block> blocks_of(Communicator& comm, LinearKernels& k, const Operand& local, WorkList& works,
                             const std::vector<torch::Tensor>& gathered, int64_t stride_rows, int64_t offset_rows) {
  for (auto& w : works) comm.wait(*w);
  std::vector<Block> blocks;
  for (int c = 0; c < comm.size(); ++c) {
    std::vector<torch::Tensor> wire;
    for (const auto& g : gathered) wire.push_back(g[c]);
    blocks.push_back({c * stride_rows + offset_rows, c == comm.rank() ? local : k.adopt(local, std::move(wire))});
  }
  return blocks;
}

std::vector<Block> gather_plain(Communicator& comm, LinearKernels& k, const Operand& local, const Consume& consume) {
  std::vector<torch::Tensor> gathered;
  WorkList works = post_gather(comm, local, gathered);
  auto blocks = blocks_of(comm, k, local, works, gathered, local.rows, 0);
  for (const auto& b : blocks) consume(b);
  return blocks;
}

// Ring exchange (plain or aggregated): every transfer is issued before the first GEMM, each
// forwarding what the previous step received (order_after: on MPI the host waits for it; on
// NCCL the group's stream already runs them in order); GEMM i then waits only for step i - 1.
std::vector<Block> gather_ring(Communicator& comm, LinearKernels& k, const Operand& local, bool aggregate,
                               const Consume& consume) {
  const int n = comm.size(), r = comm.rank();
  const auto steps = aggregate ? ring_all_gather_aggregate(n, r) : ring_all_gather(n, r);
  std::vector<Operand> held(static_cast<size_t>(n));
  std::vector<std::vector<torch::Tensor>> incoming(static_cast<size_t>(n));
  held[size_t(r)] = local;
  for (int c = 0; c < n; ++c)
    if (c != r) incoming[size_t(c)] = empty_like_wire(local);
  WorkList works(steps.size());
  CommWork* previous = nullptr;
  for (size_t i = 0; i < steps.size(); ++i) {
    const AllGatherStep& s = steps[i];
    if (s.send.empty() && s.recv.empty()) continue;
    if (previous) comm.order_after(*previous);
    std::vector<Communicator::P2POp> ops;
    for (int c : s.send) {
      const auto& wire = c == r ? local.wire : incoming[size_t(c)];
      for (const auto& t : wire) ops.push_back({true, t, s.send_to, int(i)});
    }
    for (int c : s.recv)
      for (const auto& t : incoming[size_t(c)]) ops.push_back({false, t, s.recv_from, int(i)});
    works[i] = comm.batch_p2p_async(std::move(ops));
    previous = works[i].get();
  }
  std::vector<Block> blocks;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i > 0 && works[i - 1]) {
      comm.wait(*works[i - 1]);
      for (int c : steps[i - 1].recv) held[size_t(c)] = k.adopt(local, incoming[size_t(c)]);
    }
    for (int c : steps[i].compute) {
      blocks.push_back({c * local.rows, held[size_t(c)]});
      consume(blocks.back());
    }
  }
  std::sort(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) { return a.first_row < b.first_row; });
  return blocks;
}

// MindSpeed CoC: the local rows in pieces, each piece's all-gather issued up front; the GEMMs of
// piece p run as soon as its gather is in (while later pieces still move).
std::vector<Block> gather_pieces(Communicator& comm, LinearKernels& k, const Operand& local, int pieces,
                                 const Consume& consume) {
  const auto ranges = even_splits(local.rows, pieces);
  std::vector<Operand> parts;
  std::vector<std::vector<torch::Tensor>> gathered(ranges.size());
  std::vector<WorkList> works;
  for (size_t p = 0; p < ranges.size(); ++p) {
    parts.push_back(k.slice_rows(local, ranges[p].begin, ranges[p].count));
    works.push_back(post_gather(comm, parts.back(), gathered[p]));
  }
  std::vector<Block> blocks;
  for (size_t p = 0; p < ranges.size(); ++p)
    for (auto& b : blocks_of(comm, k, parts[p], works[p], gathered[p], local.rows, ranges[p].begin)) {
      consume(b);
      blocks.push_back(std::move(b));
    }
  std::sort(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) { return a.first_row < b.first_row; });
  return blocks;
}

// All n ranks' blocks of `local`, each handed to `consume` as soon as it is present; returned in
// row order.
std::vector<Block> gather_and_consume(Communicator& comm, LinearKernels& k, const Operand& local, const GemmOverlap& how,
                                      const Consume& consume) {
  if (is_ring(how)) return gather_ring(comm, k, local, how.aggregate, consume);
  if (is_pipeline(how) && how.num_splits > 1) return gather_pieces(comm, k, local, how.num_splits, consume);
  return gather_plain(comm, k, local, consume);
}

// ---- GEMMs feeding a reduce-scatter --------------------------------------------------------------

torch::Tensor scatter_plain(Communicator& comm, int64_t rows, int64_t cols, const torch::TensorOptions& options,
                            const Produce& produce) {
  auto partial = torch::empty({rows, cols}, options);
  produce({0, rows}, {0, cols}, partial);
  auto out = torch::empty({rows / comm.size(), cols}, options);
  comm.reduce_scatter(out, partial);
  return out;
}

// FP8 partials (fp8_buf): each destination's rows quantized, sent to it, and summed there in rank
// order after dequantization; this rank's own rows go through FP8 as well, as in TE.
struct Fp8Exchange {
  std::vector<Operand> mine;                        // this rank's quantized partial, per destination
  std::vector<std::vector<torch::Tensor>> incoming;  // from each source
  std::unique_ptr<CommWork> work;
};
Fp8Exchange post_fp8_exchange(Communicator& comm, LinearKernels& k, const torch::Tensor& partial, int tag) {
  const int n = comm.size(), r = comm.rank();
  const int64_t rows = partial.size(0) / n;
  Fp8Exchange x;
  for (int d = 0; d < n; ++d) x.mine.push_back(k.quantize_partial(partial.narrow(0, d * rows, rows)));
  x.incoming.resize(static_cast<size_t>(n));
  std::vector<Communicator::P2POp> ops;
  for (int d = 0; d < n; ++d)
    if (d != r)
      for (const auto& t : x.mine[size_t(d)].wire) ops.push_back({true, t, d, tag});
  for (int s = 0; s < n; ++s)
    if (s != r) {
      x.incoming[size_t(s)] = empty_like_wire(x.mine[size_t(r)]);
      for (const auto& t : x.incoming[size_t(s)]) ops.push_back({false, t, s, tag});
    }
  x.work = comm.batch_p2p_async(std::move(ops));
  return x;
}
torch::Tensor finish_fp8_exchange(Communicator& comm, LinearKernels& k, Fp8Exchange& x) {
  comm.wait(*x.work);
  const int r = comm.rank();
  torch::Tensor sum;
  for (int s = 0; s < comm.size(); ++s) {
    const Operand block = s == r ? x.mine[size_t(r)] : k.adopt(x.mine[size_t(r)], x.incoming[size_t(s)]);
    auto v = k.dequantize_partial(block).to(torch::kFloat32);
    sum = s == 0 ? v.clone() : sum.add_(v);
  }
  return sum;
}

// Transformer Engine's pipeline: the GEMM split along its output columns; the reduce-scatter of
// split j is issued right after its GEMM and runs beside GEMM j + 1.
torch::Tensor scatter_pipeline(Communicator& comm, LinearKernels& k, const GemmOverlap& how, int64_t rows, int64_t cols,
                               const torch::TensorOptions& options, const Produce& produce) {
  const auto splits = even_splits(cols, how.num_splits);
  const int64_t local = rows / comm.size();
  std::vector<torch::Tensor> parts, results;
  WorkList works;
  std::vector<Fp8Exchange> exchanges;
  auto issue = [&](size_t j) {
    if (how.fp8_wire) {
      exchanges.push_back(post_fp8_exchange(comm, k, parts[j], int(j)));
      return;
    }
    results.push_back(torch::empty({local, splits[j].count}, options));
    works.push_back(comm.reduce_scatter_async(results.back(), parts[j]));
  };
  for (size_t j = 0; j < splits.size(); ++j) {
    // Issued before GEMM j is: the reduce-scatter of split j - 1 then waits only for GEMMs up to
    // j - 1 and runs beside GEMM j.
    if (j > 0) issue(j - 1);
    parts.push_back(torch::empty({rows, splits[j].count}, options));
    produce({0, rows}, splits[j], parts[j]);
  }
  issue(splits.size() - 1);
  auto out = torch::empty({local, cols}, options);
  for (size_t j = 0; j < splits.size(); ++j) {
    auto piece = out.narrow(1, splits[j].begin, splits[j].count);
    if (how.fp8_wire) {
      piece.copy_(finish_fp8_exchange(comm, k, exchanges[j]));
    } else {
      comm.wait(*works[j]);
      piece.copy_(results[j]);
    }
  }
  return out;
}

// Ring reduce-scatter: each step's GEMM computes one destination's rows while the previous step's
// partial travels straight to its destination; the n partials of this rank's rows are summed in
// rank order in fp32 and rounded once (the order of the MPI reduce-scatter).
torch::Tensor scatter_ring(Communicator& comm, int64_t rows, int64_t cols, const torch::TensorOptions& options,
                           const Produce& produce) {
  const int n = comm.size(), r = comm.rank();
  const int64_t local = rows / n;
  const auto steps = ring_reduce_scatter(n, r);
  std::vector<torch::Tensor> partial(static_cast<size_t>(n)), from(static_cast<size_t>(n));
  WorkList works;
  for (size_t i = 0; i < steps.size(); ++i) {
    const ReduceScatterStep& s = steps[i];
    if (i > 0) {
      from[size_t(s.recv_from)] = torch::empty({local, cols}, options);
      works.push_back(comm.batch_p2p_async({{true, partial[i - 1], s.send_to, int(i)},
                                            {false, from[size_t(s.recv_from)], s.recv_from, int(i)}}));
    }
    partial[i] = torch::empty({local, cols}, options);
    produce({s.gemm_dest * local, local}, {0, cols}, partial[i]);
  }
  for (auto& w : works) comm.wait(*w);
  from[size_t(r)] = partial[size_t(n - 1)];
  auto sum = from[0].to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
  for (int s = 1; s < n; ++s) sum.add_(from[size_t(s)].to(torch::kFloat32));
  return sum.to(options.dtype());
}

// This rank's rows of the sum over ranks of the [rows, cols] partial output that `produce` computes.
torch::Tensor produce_and_reduce_scatter(Communicator& comm, LinearKernels& k, const GemmOverlap& how, int64_t rows,
                                         int64_t cols, const torch::TensorOptions& options, const Produce& produce) {
  FP8TRON_CHECK(rows % comm.size() == 0, "reduce-scatter: rows not divisible by the tensor-parallel size");
  if (is_ring(how)) return scatter_ring(comm, rows, cols, options, produce);
  if (is_pipeline(how)) return scatter_pipeline(comm, k, how, rows, cols, options, produce);
  return scatter_plain(comm, rows, cols, options, produce);
}

std::vector<Operand> operands(const std::vector<Block>& blocks) {
  std::vector<Operand> out;
  for (const auto& b : blocks) out.push_back(b.op);
  return out;
}

// ---- the autograd node -------------------------------------------------------------------------

struct TpLinearBackward : public torch::autograd::Node {
  std::shared_ptr<LinearKernels> kernels;
  TpLinearPlan plan;
  Communicator* comm = nullptr;
  Operand saved;  // column: this rank's input rows to gather again; row: the input operand
  std::vector<int64_t> input_shape;
  int64_t in_features = 0, out_features = 0;  // the GEMM's (a prologue may change the input's width)
  size_t extra_inputs = 0;
  torch::TensorOptions input_options;
  bool has_bias = false;

  std::string name() const override { return "TpLinearBackward"; }
  void release_variables() override {
    kernels.reset();
    saved = Operand{};
  }

  variable_list apply(variable_list&& grads) override {
    FP8TRON_CHECK(kernels, "TpLinearBackward ran twice (retain_graph is not supported for overlapped linears)");
    variable_list out(3 + extra_inputs);
    if (grads[0].defined()) {
      bool need_dx = task_should_compute_output(0);
      for (size_t e = 0; e < extra_inputs; ++e) need_dx = need_dx || task_should_compute_output(3 + e);
      const bool need_dw = task_should_compute_output(1), need_db = has_bias && task_should_compute_output(2);
      torch::NoGradGuard no_grad;
      const auto dy = grads[0].reshape({-1, out_features});
      torch::Tensor dx = plan.column ? column_backward(dy, need_dx, need_dw, need_db, out)
                                     : row_backward(dy, need_dx, need_dw, out);
      if (need_dx) {
        auto input_grads = kernels->input_grads(dx);
        out[0] = input_grads.at(0).view(input_shape);
        for (size_t e = 0; e < extra_inputs && e + 1 < input_grads.size(); ++e) out[3 + e] = input_grads[e + 1];
      }
    }
    release_variables();
    return out;
  }

  // dX partial = dY W over all rows, reduce-scattered to this rank's rows; dW from the input
  // gathered again (under the dgrad GEMM when bulk, or rs-dgrad's async gather).
  torch::Tensor column_backward(const torch::Tensor& dy, bool need_dx, bool need_dw, bool need_db, variable_list& out) {
    LinearKernels& k = *kernels;
    Communicator& c = *comm;
    const int64_t rows = dy.size(0);
    const Operand dq = k.prepare_grad_output(dy, /*to_gather=*/false);
    const bool rs_dgrad = is_ring(plan.dgrad) || is_pipeline(plan.dgrad);
    const bool early_gather = need_dw && (plan.dgrad.method == OverlapMethod::kBulk || rs_dgrad);
    std::vector<torch::Tensor> gathered;
    WorkList gather;
    if (early_gather) gather = post_gather(c, saved, gathered);
    torch::Tensor dx;
    std::unique_ptr<CommWork> rs;
    if (need_dx) {
      const Produce produce = [&](Range r, Range cols, torch::Tensor& o) { k.dgrad(dq, r, cols, o); };
      if (rs_dgrad) {
        dx = produce_and_reduce_scatter(c, k, plan.dgrad, rows, in_features, input_options, produce);
      } else {
        auto partial = torch::empty({rows, in_features}, input_options);
        produce({0, rows}, {0, in_features}, partial);
        dx = torch::empty({rows / c.size(), in_features}, input_options);
        if (need_dw && plan.wgrad.method == OverlapMethod::kBulk) rs = c.reduce_scatter_async(dx, partial);
        else c.reduce_scatter(dx, partial);
      }
    }
    if (need_dw || need_db) {
      Operand x;
      if (need_dw) {
        if (!early_gather) gather = post_gather(c, saved, gathered);
        x = k.join(operands(blocks_of(c, k, saved, gather, gathered, saved.rows, 0)), /*grad_output=*/false);
      }
      WeightGrads g = k.wgrad(dq, x, need_dw, need_db);
      out[1] = g.weight;
      out[2] = g.bias;
    }
    if (rs) c.wait(*rs);
    return dx;
  }

  // dY gathered (ring: each block's dgrad as soon as it arrives); dW from the gathered dY.
  torch::Tensor row_backward(const torch::Tensor& dy, bool need_dx, bool need_dw, variable_list& out) {
    LinearKernels& k = *kernels;
    const Operand dq = k.prepare_grad_output(dy, /*to_gather=*/true);
    const int64_t rows = dq.rows * comm->size();
    torch::Tensor dx = need_dx ? torch::empty({rows, in_features}, input_options) : torch::Tensor();
    const Consume consume = [&](const Block& b) {
      if (!need_dx) return;
      auto o = dx.narrow(0, b.first_row, b.op.rows);
      k.dgrad(b.op, {0, b.op.rows}, {0, in_features}, o);
    };
    auto blocks = gather_and_consume(*comm, k, dq, plan.dgrad, consume);
    if (need_dw) out[1] = k.wgrad(k.join(operands(blocks), /*grad_output=*/true), saved, true, false).weight;
    return dx;
  }
};

std::vector<int64_t> output_shape(const torch::Tensor& x, bool column, int n, int64_t out_features) {
  auto shape = x.sizes().vec();
  shape[0] = column ? shape[0] * n : shape[0] / n;
  shape.back() = out_features;
  return shape;
}

}  // namespace

bool plan_for_module(const TpOverlapConfig& config, const std::string& name, TpLinearPlan* plan) {
  if (!config.enabled()) return false;
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  auto set = [&](bool column, TpGemm fprop, TpGemm dgrad, TpGemm wgrad) {
    *plan = TpLinearPlan{column, config.gemm(fprop), config.gemm(dgrad), config.gemm(wgrad)};
    return true;
  };
  if (ends_with(".linear_qkv")) return set(true, TpGemm::kQkvFprop, TpGemm::kQkvDgrad, TpGemm::kQkvWgrad);
  if (ends_with(".linear_fc1")) return set(true, TpGemm::kFc1Fprop, TpGemm::kFc1Dgrad, TpGemm::kFc1Wgrad);
  if (ends_with(".linear_proj")) return set(false, TpGemm::kProjFprop, TpGemm::kProjDgrad, TpGemm::kProjWgrad);
  if (ends_with(".linear_fc2")) return set(false, TpGemm::kFc2Fprop, TpGemm::kFc2Dgrad, TpGemm::kFc2Wgrad);
  if (name == "output_layer" && config.output_layer) {
    // MindSpeed's MC2 output layer: the all-gather pipelined like qkv's, backward as the plain
    // mapping (reduce-scatter of dgrad, no bulk overlap: Megatron's ColumnParallelLinear).
    *plan = TpLinearPlan{true, config.gemm(TpGemm::kQkvFprop), GemmOverlap{}, GemmOverlap{}};
    return true;
  }
  return false;
}

torch::Tensor tp_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                        const std::vector<torch::Tensor>& extra_inputs, std::shared_ptr<LinearKernels> kernels,
                        const TpLinearPlan& plan, Communicator& tp, int64_t out_features) {
  const int n = tp.size();
  const int64_t in_features = weight.size(1);
  const bool grad_mode = torch::GradMode::is_enabled();
  auto wants_grad = [](const torch::Tensor& t) { return t.defined() && t.requires_grad(); };
  bool track = grad_mode && (wants_grad(x) || wants_grad(weight) || wants_grad(bias));
  for (const auto& e : extra_inputs) track = track || (grad_mode && wants_grad(e));
  const auto options = x.options();
  torch::Tensor y;
  Operand saved;
  {
    torch::NoGradGuard no_grad;
    const auto x2d = x.detach().reshape({-1, x.size(-1)});
    LinearKernels& k = *kernels;
    if (plan.column) {
      const Operand local = k.prepare_input(x2d, /*to_gather=*/true);
      y = torch::empty({local.rows * n, out_features}, options);
      gather_and_consume(tp, k, local, plan.fprop, [&](const Block& b) {
        auto o = y.narrow(0, b.first_row, b.op.rows);
        k.fprop(b.op, {0, b.op.rows}, {0, out_features}, o);
      });
      if (track) saved = k.saved_input(local, /*gathered_in_backward=*/true);
    } else {
      const Operand input = k.prepare_input(x2d, /*to_gather=*/false);
      y = produce_and_reduce_scatter(tp, k, plan.fprop, input.rows, out_features, options,
                                     [&](Range r, Range c, torch::Tensor& o) { k.fprop(input, r, c, o); });
      if (track) saved = k.saved_input(input, /*gathered_in_backward=*/false);
    }
    // Not a view: autograd attaches the node to y as to any function's fresh output.
    y = at::_unsafe_view(y, output_shape(x, plan.column, n, out_features));
  }
  if (!track) return y;
  auto node = std::shared_ptr<TpLinearBackward>(new TpLinearBackward(), torch::autograd::deleteNode);
  node->kernels = std::move(kernels);
  node->plan = plan;
  node->comm = &tp;
  node->saved = std::move(saved);
  node->input_shape = x.sizes().vec();
  node->in_features = in_features;
  node->out_features = out_features;
  node->extra_inputs = extra_inputs.size();
  node->input_options = options;
  node->has_bias = bias.defined();
  std::vector<torch::Tensor> inputs = {x, weight, bias};
  for (const auto& e : extra_inputs) inputs.push_back(e);
  node->set_next_edges(torch::autograd::collect_next_edges(at::ArrayRef<torch::Tensor>(inputs)));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace fp8tron::overlap
