// CUDA kernel of the fused rotary embedding (models/attention/rotary.h), torch-free: raw pointers, sizes,
// strides and a stream. One pass reads x (any strides, last dimension contiguous) and writes the
// rotated tensor contiguously, in fp32 arithmetic rounded once; the backward pass is the same kernel
// with the sine negated (the rotation's transpose).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/float_type.h"

namespace fp8tron::kernels {

// x viewed as [s, b, g, p, d] with element strides x_stride[0..3] (d's stride is 1): heads are
// (g, p) pairs, so the query part of a fused QKV projection ([s, b, groups, per_group + 2, d])
// needs no copy. out is contiguous [s, b, g * p, d]. The first `dim` channels of each head are
// rotated by the angles of its token's row (cos/sin tables fp32 [s, dim / 2], already multiplied
// by any concentration factor); channels from dim on pass through. interleaved: channel 2i pairs
// with 2i + 1 (else i with i + dim / 2, "rotate half"). sin_sign -1 applies the inverse rotation.
struct RotaryShape {
  int64_t s, b, g, p, d, dim;
  int64_t x_stride[4];
  bool interleaved;
};
void rotary_apply(const void* x, void* out, FloatType dtype, const RotaryShape& shape, const float* cos,
                  const float* sin, float sin_sign, cudaStream_t stream);

}  // namespace fp8tron::kernels
