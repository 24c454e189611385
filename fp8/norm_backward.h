// The backward of the LayerNorm / RMSNorm that fp8_norm_linear fuses into its input's cast (and the
// overlapped FP8 op, models/linear/linear_kernels_fp8.h): torch's native_layer_norm_backward /
// _fused_rms_norm_backward unless the engine is given a faster one (Fp8Engine::use_backward_kernels).
// The models library gives its own fused norm kernel (models/norm/residual_norm.h), which fp8/
// cannot link against: fp8/ sits below models/ in the layering. That function must be a drop-in:
// the same gradients to within rounding, for any rows it accepts; it falls back to
// torch_norm_backward itself where its kernel does not apply.
#pragma once
#include <torch/torch.h>

namespace fp8tron::fp8 {

struct NormBackwardInputs {
  torch::Tensor d_normed;     // [rows, hidden], the input's dtype
  torch::Tensor input;        // [rows, hidden]: the norm's input as the forward saved it
  torch::Tensor mean, rstd;   // fp32 [rows]; mean undefined for RMSNorm
  torch::Tensor gamma, beta;  // [hidden] as the forward applied them (gamma + 1 when zero-centred); beta may be undefined
  bool want_dgamma = false, want_dbeta = false;
};
struct NormBackwardGrads {
  torch::Tensor dx, dgamma, dbeta;  // the parameter gradients undefined unless wanted
};

using NormBackwardFn = NormBackwardGrads (*)(const NormBackwardInputs&);


// torch's kernels.
NormBackwardGrads torch_norm_backward(const NormBackwardInputs& in);

}  // namespace fp8tron::fp8
