// CPU reference for quantize.h: the same contracts on host memory (every pointer in the views is a
// host pointer), the same fp32 arithmetic, hence the same bits. Used by the CPU emulation path
// and as the oracle of the GPU kernel tests. Written for clarity, not speed.
#pragma once
#include <cstddef>
#include <cstdint>

#include "fp8/fp8_tensor.h"
#include "fp8/quantize.h"

namespace fp8tron::fp8::reference {

float amax_bf16(const uint16_t* x, size_t n);

void quantize_tensor_delayed(const uint16_t* x, const Fp8TensorView& out);
void quantize_tensor_current(const uint16_t* x, const Fp8TensorView& out, const CurrentScalingOptions& options);
void quantize_tensor_current_given_amax(const uint16_t* x, const Fp8TensorView& out, const CurrentScalingOptions& options);
void quantize_blockwise(const uint16_t* x, const Fp8TensorView& out, const BlockScalingOptions& options);
void quantize_mxfp8(const uint16_t* x, const Fp8TensorView& out);

// Segment by segment: its rows copied into a zero-padded buffer, then the cast above of its kind.
// Column sums are plain fp32 sums in row order.
void quantize_segments(const uint16_t* x, const SegmentLayout& layout, const SegmentedFp8View& out,
                       const SegmentCast& cast);

void dequantize(const Fp8TensorView& in, bool transposed_copy, uint16_t* y);
// decode(q) * scale_inv in fp32, without the bf16 rounding (reference GEMM inputs).
void dequantize_to_float(const Fp8TensorView& in, bool transposed_copy, float* y);

}  // namespace fp8tron::fp8::reference
