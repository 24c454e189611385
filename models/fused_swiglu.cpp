#include "models/fused_swiglu.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "core/error.h"
#include "models/kernel_float_of.h"
#include "models/swiglu_kernels.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

cudaStream_t stream_of(const torch::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

// The kernels take contiguous [rows, 2f] / [rows, f] buffers; rows are all leading dimensions.
struct FusedSwiglu : torch::autograd::Function<FusedSwiglu> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in) {
    const c10::cuda::CUDAGuard device(x_in.device());
    auto x = x_in.contiguous();
    const int64_t f = x.size(-1) / 2, rows = f == 0 ? 0 : x.numel() / (2 * f);
    auto out_shape = x.sizes().vec();
    out_shape.back() = f;
    auto y = torch::empty(out_shape, x.options());
    kernels::swiglu_forward(x.data_ptr(), y.data_ptr(), *kernel_float_of(x), rows, f, stream_of(x));
    ctx->save_for_backward({x});  // x alone: backward recomputes silu(gate)
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto x = ctx->get_saved_variables()[0];
    const c10::cuda::CUDAGuard device(x.device());
    // The gradient of a sum arrives expanded (stride 0), of a cast in another dtype.
    auto dy = grad[0].to(x.scalar_type()).contiguous();
    const int64_t f = x.size(-1) / 2, rows = f == 0 ? 0 : x.numel() / (2 * f);
    auto dx = torch::empty_like(x);
    kernels::swiglu_backward(dy.data_ptr(), x.data_ptr(), dx.data_ptr(), *kernel_float_of(x), rows, f, stream_of(x));
    return {dx};
  }
};

}  // namespace

torch::Tensor unfused_swiglu(const torch::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return at::silu(halves[0]) * halves[1];
}

torch::Tensor fused_swiglu(const torch::Tensor& x) {
  FP8TRON_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0,
                "SwiGLU input of last dimension " + std::to_string(x.dim() ? x.size(-1) : 0) +
                    ": [gate | up] needs an even size");
  if (!x.is_cuda() || !kernel_float_of(x)) return unfused_swiglu(x);
  return FusedSwiglu::apply(x);
}

}  // namespace fp8tron
