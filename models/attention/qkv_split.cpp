#include "models/attention/qkv_split.h"

#include <algorithm>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "core/error.h"
#include "models/linear/strided_rows_kernels.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<torch::Tensor> split_views(const torch::Tensor& qkv, int64_t per_group, bool gated) {
  if (!gated) {
    auto parts = qkv.split_with_sizes({per_group, 1, 1}, 3);
    return {parts[0], parts[1].squeeze(3), parts[2].squeeze(3)};
  }
  auto parts = qkv.split_with_sizes({per_group, per_group, 1, 1}, 3);
  return {parts[0], parts[2].squeeze(3), parts[3].squeeze(3), parts[1]};
}

// Copies `grad` (the 4-D rows of one part, last dimension d contiguous) into its slots of the
// contiguous [s, b, groups, per_group + 2, d] gradient `dqkv`, from slot `first` on.
void place(const torch::Tensor& grad_in, torch::Tensor& dqkv, int64_t first) {
  const int64_t slots = grad_in.dim() == 5 ? grad_in.size(3) : 1;
  auto part = dqkv.narrow(3, first, slots);
  if (!grad_in.defined()) return;  // zeroed by the caller
  auto grad = grad_in.to(dqkv.scalar_type());
  if (grad.stride(-1) != 1) grad = grad.contiguous();
  const auto g5 = grad.dim() == 5 ? grad : grad.unsqueeze(3);
  kernels::StridedRows layout;
  for (int dim = 0; dim < 4; ++dim) {
    layout.sizes[dim] = g5.size(dim);
    layout.src_strides[dim] = g5.size(dim) == 1 ? 0 : g5.stride(dim);
    layout.dst_strides[dim] = part.stride(dim);
  }
  layout.row_elems = dqkv.size(4);
  layout.elem_bytes = int(dqkv.element_size());
  kernels::copy_strided_rows(grad.data_ptr(), part.data_ptr(), layout,
                             c10::cuda::getCurrentCUDAStream(dqkv.device().index()).stream());
}

struct SplitQkv : torch::autograd::Function<SplitQkv> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& qkv, int64_t per_group, bool gated) {
    ctx->saved_data["sizes"] = qkv.sizes().vec();
    ctx->saved_data["dtype"] = int64_t(qkv.scalar_type());
    ctx->saved_data["device"] = int64_t(qkv.device().index());
    ctx->saved_data["per_group"] = per_group;
    return split_views(qkv, per_group, gated);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const auto dtype = torch::ScalarType(ctx->saved_data["dtype"].toInt());
    const torch::Device device(torch::kCUDA, c10::DeviceIndex(ctx->saved_data["device"].toInt()));
    const c10::cuda::CUDAGuard guard(device);
    const bool all = std::all_of(grads.begin(), grads.end(), [](const torch::Tensor& g) { return g.defined(); });
    auto dqkv = all ? torch::empty(sizes, torch::TensorOptions(dtype).device(device))
                    : torch::zeros(sizes, torch::TensorOptions(dtype).device(device));
    const int64_t per_group = ctx->saved_data["per_group"].toInt(), slots = sizes[3];
    place(grads[0], dqkv, 0);
    place(grads[1], dqkv, slots - 2);
    place(grads[2], dqkv, slots - 1);
    if (grads.size() == 4) place(grads[3], dqkv, per_group);
    return {dqkv, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::vector<torch::Tensor> split_qkv(const torch::Tensor& qkv, int64_t per_group, bool gated) {
  FP8TRON_CHECK(qkv.dim() == 5 && qkv.size(3) == (gated ? 2 * per_group : per_group) + 2,
                "split_qkv: qkv must be [s, b, groups, per_group + 2, d] (2 per_group + 2 with the output gate)");
  const bool kernel = qkv.is_cuda() && (qkv.element_size() == 2 || qkv.element_size() == 4);
  if (!kernel || !qkv.requires_grad()) return split_views(qkv, per_group, gated);
  return SplitQkv::apply(qkv, per_group, gated);
}

}  // namespace fp8tron
