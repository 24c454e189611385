// The communicating linear: one autograd op that owns a tensor-parallel linear's collectives and
// GEMMs in forward and backward, with sequence parallelism, and overlaps them as its plan says
// (Transformer Engine's userbuffer overlaps, MindSpeed's MC2/CoC; docs/overlap.md):
//
//   column-parallel (qkv, fc1, the output layer): x is this rank's sequence shard [s/n, b, in]
//     forward   all-gather of x -> y = x W^T (+ b), [s, b, out/n]   plan.fprop: ring / CoC pieces
//     backward  dX = dY W, reduce-scattered to the shard; dW = dY^T x with x gathered again:
//               plan.dgrad Bulk = that all-gather under the dgrad GEMM, Pipeline/RingExchange =
//               dgrad's reduce-scatter pipelined with it (--tp-comm-overlap-rs-dgrad);
//               plan.wgrad Bulk = dgrad's reduce-scatter under the wgrad GEMM
//   row-parallel (proj, fc2): x is [s, b, in/n]
//     forward   partial y = x W^T, reduce-scattered to [s/n, b, out]   plan.fprop: pipeline / ring
//     backward  all-gather of dY -> dX = dY W; dW = dY^T x from the gathered dY   plan.dgrad: ring
//
// A direction whose method is Off runs the plain blocking collective; every method computes the
// same products in the same order per element as the plain mappings (tensor_parallel.h) followed
// by one linear, so on CPU the results are bitwise those of the non-overlapped run
// (docs/overlap.md lists what is bitwise where). Transfers are issued so that on NCCL they run on
// the group's stream beside the GEMMs on the compute stream (the group's operations wait only for
// compute issued before them): a ring's steps are all issued before its GEMMs, a pipelined
// reduce-scatter's piece right after the GEMM that produced it.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "core/config/parallel_config.h"
#include "parallel/communicator.h"
#include "parallel/overlap/linear_kernels.h"

namespace fp8tron::overlap {

struct TpLinearPlan {
  bool column = true;  // column-parallel (gather before) or row-parallel (reduce-scatter after)
  GemmOverlap fprop, dgrad, wgrad;
};

// The plan of a module from the run's overlap configuration: `name` is the module's global name
// (its suffix .linear_qkv / .linear_proj / .linear_fc1 / .linear_fc2 picks the GEMMs, "output_layer"
// the output layer). False when the module is not overlapped.
bool plan_for_module(const TpOverlapConfig& config, const std::string& name, TpLinearPlan* plan);

// y = x W^T (+ bias) as above. `weight` and `bias` are the autograd inputs (the kernels read their
// values); `extra_inputs` are further differentiable inputs whose gradients the kernels return
// (a norm fused into the input's cast). `out_features` = rows of this rank's weight.
torch::Tensor tp_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                        const std::vector<torch::Tensor>& extra_inputs, std::shared_ptr<LinearKernels> kernels,
                        const TpLinearPlan& plan, Communicator& tp, int64_t out_features);

}  // namespace fp8tron::overlap
