// The arithmetic of an overlapped tensor-parallel linear, as the communicating op (tp_linear.h)
// sees it: a "GEMM functor" that prepares operands and multiplies row blocks of them, implemented
// by models/ twice (plain high-precision GEMMs, and FP8 over fp8/'s quantizers and GEMMs). The op
// decides which rows move where and when; the kernels decide what a row block is made of (bf16
// rows, or FP8 codes and their scales) and how it is multiplied. parallel/ knows nothing of FP8.
//
// Matrices are 2-D, rows = tokens: x [rows, in], the weight W [out, in] (this rank's shard), y
// [rows, out]. One kernels object serves one forward call and its backward: it may keep state
// between the calls (amaxes, prologue inputs, a fused bias gradient).
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "parallel/overlap/schedule.h"

namespace fp8tron::overlap {

// Rows of a matrix as the kernels prepared them. `wire` are the contiguous tensors that stand for
// the rows between ranks (every rank's block of a collective has the same shapes and dtypes);
// `state` is the kernels' own (e.g. a quantized tensor with its dequantization factors).
struct Operand {
  int64_t rows = 0;
  std::vector<torch::Tensor> wire;
  std::shared_ptr<void> state;
};

struct WeightGrads {
  torch::Tensor weight, bias;  // undefined when not needed, or when accumulated into a main gradient
};

class LinearKernels {
 public:
  virtual ~LinearKernels() = default;

  // ---- forward
  // The op's input rows x [rows, in] as an operand. `to_gather`: these are this rank's rows of a
  // column-parallel input that the other ranks will receive (FP8: quantised before the gather,
  // with amaxes and scales that equal those of the gathered tensor); otherwise the rows of a
  // row-parallel input (kept whole on this rank).
  virtual Operand prepare_input(const torch::Tensor& x, bool to_gather) = 0;
  // Rows [begin, begin + count) of an operand made by prepare_input or prepare_grad_output, as an
  // operand of its own (MindSpeed CoC's pieces).
  virtual Operand slice_rows(const Operand& op, int64_t begin, int64_t count) = 0;
  // A block received from another rank: `wire` holds what that rank's block of the same collective
  // held; `local` is this rank's block (shared facts such as a per-tensor scale come from it).
  virtual Operand adopt(const Operand& local, std::vector<torch::Tensor> wire) = 0;
  // out [rows.count, cols.count] = x[rows] W[cols]^T (+ bias[cols]); out is contiguous.
  virtual void fprop(const Operand& x, Range rows, Range cols, torch::Tensor& out) = 0;
  // What backward needs of the input: for a column-parallel op, this rank's rows that backward
  // gathers again for wgrad (their wire); for a row-parallel op, the operand itself.
  virtual Operand saved_input(const Operand& x, bool gathered_in_backward) = 0;

  // ---- backward
  // The output gradient dy [rows, out] as an operand. `to_gather`: a row-parallel op's rows, which
  // every rank receives for its dgrad and wgrad; otherwise a column-parallel op's full gradient.
  virtual Operand prepare_grad_output(const torch::Tensor& dy, bool to_gather) = 0;
  // out [rows.count, cols.count] = dy[rows] W[:, cols]; out is contiguous.
  virtual void dgrad(const Operand& dy, Range rows, Range cols, torch::Tensor& out) = 0;
  // The gathered side of wgrad (the input of a column-parallel op, dy of a row-parallel one) from
  // its blocks in row order.
  virtual Operand join(const std::vector<Operand>& blocks, bool grad_output) = 0;
  // dW = dy^T x over all rows (one GEMM) when `need_dw` (x is unset otherwise), and the bias
  // gradient when `need_db` (column-parallel ops own their bias).
  virtual WeightGrads wgrad(const Operand& dy, const Operand& x, bool need_dw, bool need_db) = 0;
  // The gradient of the op's input (its rows, 2-D) from dx = dy W [rows, in] (e.g. through a
  // prologue's derivative); more entries are the gradients of the kernels' extra inputs
  // (tp_linear's `extra_inputs`).
  virtual std::vector<torch::Tensor> input_grads(torch::Tensor dx) = 0;

  // ---- FP8 reduce-scatter (GemmOverlap::fp8_wire on a pipelined reduce-scatter)
  // A partial output's rows as an operand for the wire, and back to high precision for the sum.
  virtual Operand quantize_partial(const torch::Tensor& rows) = 0;
  virtual torch::Tensor dequantize_partial(const Operand& block) = 0;
};

}  // namespace fp8tron::overlap
