#include "models/linear/linear_kernels_plain.h"

#include "core/error.h"

namespace fp8tron {

using overlap::Operand;
using overlap::Range;

PlainLinearKernels::PlainLinearKernels(torch::Tensor weight, torch::Tensor bias)
    : weight_(weight.detach()), bias_(bias.defined() ? bias.detach() : bias) {}

Operand PlainLinearKernels::prepare_input(const torch::Tensor& x, bool to_gather) {
  // Gathered rows travel, so they must be contiguous; a local input is multiplied as it is, as
  // F::linear does.
  return Operand{x.size(0), {to_gather ? x.contiguous() : x}, nullptr};
}

Operand PlainLinearKernels::slice_rows(const Operand& op, int64_t begin, int64_t count) {
  return Operand{count, {op.wire[0].narrow(0, begin, count).contiguous()}, nullptr};
}

Operand PlainLinearKernels::adopt(const Operand&, std::vector<torch::Tensor> wire) {
  const int64_t rows = wire[0].size(0);
  return Operand{rows, std::move(wire), nullptr};
}

// F::linear's forward: addmm(bias, x, W^T), or mm without a bias; the products of a row block or
// of a block of W's rows are those of the whole.
void PlainLinearKernels::fprop(const Operand& x, Range rows, Range cols, torch::Tensor& out) {
  const auto a = x.wire[0].narrow(0, rows.begin, rows.count);
  const auto w = weight_.narrow(0, cols.begin, cols.count);
  if (bias_.defined()) at::addmm_out(out, bias_.narrow(0, cols.begin, cols.count), a, w.t());
  else at::mm_out(out, a, w.t());
}

Operand PlainLinearKernels::saved_input(const Operand& x, bool) { return x; }

Operand PlainLinearKernels::prepare_grad_output(const torch::Tensor& dy, bool to_gather) {
  return Operand{dy.size(0), {to_gather ? dy.contiguous() : dy}, nullptr};
}

// Autograd's input gradient of addmm/mm: dY W.
void PlainLinearKernels::dgrad(const Operand& dy, Range rows, Range cols, torch::Tensor& out) {
  at::mm_out(out, dy.wire[0].narrow(0, rows.begin, rows.count), weight_.narrow(1, cols.begin, cols.count));
}

Operand PlainLinearKernels::join(const std::vector<Operand>& blocks, bool) {
  if (blocks.size() == 1) return blocks[0];
  std::vector<torch::Tensor> rows;
  int64_t total = 0;
  for (const auto& b : blocks) {
    rows.push_back(b.wire[0]);
    total += b.rows;
  }
  return Operand{total, {torch::cat(rows, 0)}, nullptr};
}

// Autograd's weight gradient of addmm/mm (dY^T X, as mm_mat2_backward computes it for W^T) and the
// bias gradient (the sum over rows).
overlap::WeightGrads PlainLinearKernels::wgrad(const Operand& dy, const Operand& x, bool need_dw, bool need_db) {
  overlap::WeightGrads g;
  if (need_dw) g.weight = torch::mm(dy.wire[0].t(), x.wire[0]);
  if (need_db && bias_.defined()) g.bias = dy.wire[0].sum(0);
  return g;
}

std::vector<torch::Tensor> PlainLinearKernels::input_grads(torch::Tensor dx) { return {dx}; }

Operand PlainLinearKernels::quantize_partial(const torch::Tensor&) {
  FP8TRON_CHECK(false, "an FP8 reduce-scatter needs FP8 linears");
}
torch::Tensor PlainLinearKernels::dequantize_partial(const Operand&) {
  FP8TRON_CHECK(false, "an FP8 reduce-scatter needs FP8 linears");
}

}  // namespace fp8tron
