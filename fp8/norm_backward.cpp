#include "fp8/norm_backward.h"

namespace fp8tron::fp8 {

NormBackwardGrads torch_norm_backward(const NormBackwardInputs& in) {
  const int64_t rows = in.input.size(0), h = in.input.size(1);
  if (in.mean.defined()) {
    auto g = at::native_layer_norm_backward(in.d_normed, in.input, {h}, in.mean.view({rows, 1}), in.rstd.view({rows, 1}),
                                            in.gamma, in.beta, {true, in.want_dgamma, in.want_dbeta && in.beta.defined()});
    return {std::get<0>(g), std::get<1>(g), std::get<2>(g)};
  }
  auto g = at::_fused_rms_norm_backward(in.d_normed, in.input, {h}, in.rstd.view({rows, 1}), in.gamma, {true, in.want_dgamma});
  return {std::get<0>(g), std::get<1>(g), torch::Tensor()};
}

}  // namespace fp8tron::fp8
