// Dequantize kernels for the emulated paths: per-tensor and block-scaled codes back to bf16.
#include "fp8/quantize_device.cuh"

namespace fp8tron::fp8 {
using namespace cast;

namespace {

template <Format F>
__global__ void __launch_bounds__(kThreads)
    dequantize_tensor_kernel(const uint8_t* q, size_t n, bool vectorized, const float* scale_inv, uint16_t* y) {
  const float factor = *scale_inv;
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t start = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  size_t scalar_begin = 0;
  if (vectorized) {  // 16 codes in, 16 bf16 out
    const uint4* qv = reinterpret_cast<const uint4*>(q);
    uint4* yv = reinterpret_cast<uint4*>(y);
    const size_t nv = n / 16;
    for (size_t i = start; i < nv; i += stride) {
      const uint4 c = __ldg(qv + i);
      const uint32_t w[4] = {c.x, c.y, c.z, c.w};
      uint32_t o[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint32_t word = w[k / 2];
        const int shift = (k & 1) * 16;
        const uint16_t lo = codec::float_to_bf16(decode1<F>((word >> shift) & 0xFFu) * factor);
        const uint16_t hi = codec::float_to_bf16(decode1<F>((word >> (shift + 8)) & 0xFFu) * factor);
        o[k] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
      }
      yv[2 * i] = make_uint4(o[0], o[1], o[2], o[3]);
      yv[2 * i + 1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
    scalar_begin = nv * 16;
  }
  for (size_t i = scalar_begin + start; i < n; i += stride) y[i] = codec::float_to_bf16(decode1<F>(q[i]) * factor);
}

// Block-scaled copies: each thread converts 8 consecutive codes of a row (one scale block, since
// 8 divides 32 and 128). cols % 8 == 0.
template <Format F>
__global__ void __launch_bounds__(kThreads) dequantize_blocks_kernel(const uint8_t* q, size_t rows, size_t cols,
                                                                     ScalingMode mode, size_t ld,
                                                                     const void* scale_inv, uint16_t* y) {
  const size_t groups = rows * (cols / 8);
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  for (size_t g = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; g < groups; g += stride) {
    const size_t r = g / (cols / 8), c = (g % (cols / 8)) * 8;
    float factor;
    if (mode == ScalingMode::kMxfp8) {
      factor = codec::decode_e8m0(static_cast<const uint8_t*>(scale_inv)[r * ld + c / kMxBlock]);
    } else if (mode == ScalingMode::kBlock1x128) {
      factor = static_cast<const float*>(scale_inv)[(c / kBlockLen) * ld + r];
    } else {
      factor = static_cast<const float*>(scale_inv)[(r / kBlockLen) * ld + c / kBlockLen];
    }
    const uint2 codes = __ldg(reinterpret_cast<const uint2*>(q + r * cols + c));
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t word = k < 2 ? codes.x : codes.y;
      const int shift = (k & 1) * 16;
      const uint16_t lo = codec::float_to_bf16(decode1<F>((word >> shift) & 0xFFu) * factor);
      const uint16_t hi = codec::float_to_bf16(decode1<F>((word >> (shift + 8)) & 0xFFu) * factor);
      o[k] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
    *reinterpret_cast<uint4*>(y + r * cols + c) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

}  // namespace

void dequantize(const Fp8TensorView& in, bool transposed_copy, uint16_t* y, CudaStream stream) {
  check_element_format(in.format, in.scaling_mode == ScalingMode::kTensor);
  const size_t rows = transposed_copy ? in.cols : in.rows, cols = transposed_copy ? in.rows : in.cols;
  const auto* q = static_cast<const uint8_t*>(transposed_copy ? in.data_t : in.data);
  const void* sinv = transposed_copy ? in.scale_inv_for_t() : in.scale_inv;
  FP8TRON_CHECK(q != nullptr && sinv != nullptr, "dequantize: missing codes or scales");
  const size_t n = rows * cols;
  if (n == 0) return;
  if (in.scaling_mode == ScalingMode::kTensor) {
    const bool vec = aligned16(q) && aligned16(y);
    const unsigned grid = grid_for(vec ? n / 16 : n);
    const auto* s = static_cast<const float*>(sinv);
    switch (in.format) {
      case Format::kE4M3: dequantize_tensor_kernel<Format::kE4M3><<<grid, kThreads, 0, stream>>>(q, n, vec, s, y); break;
      case Format::kE5M2: dequantize_tensor_kernel<Format::kE5M2><<<grid, kThreads, 0, stream>>>(q, n, vec, s, y); break;
      default: dequantize_tensor_kernel<Format::kHiF8><<<grid, kThreads, 0, stream>>>(q, n, vec, s, y); break;
    }
    FP8TRON_CUDA_CHECK_LAUNCH("dequantize_tensor_kernel");
    return;
  }
  FP8TRON_CHECK(cols % 8 == 0 && aligned16(y) && (reinterpret_cast<uintptr_t>(q) & 7u) == 0,
                "block-scaled dequantize needs cols % 8 == 0 and aligned pointers");
  const size_t ld = scale_layout(in.scaling_mode, rows, cols).ld;
  const unsigned grid = grid_for(n / 8);
  if (in.format == Format::kE4M3) {
    dequantize_blocks_kernel<Format::kE4M3><<<grid, kThreads, 0, stream>>>(q, rows, cols, in.scaling_mode, ld, sinv, y);
  } else {
    dequantize_blocks_kernel<Format::kE5M2><<<grid, kThreads, 0, stream>>>(q, rows, cols, in.scaling_mode, ld, sinv, y);
  }
  FP8TRON_CUDA_CHECK_LAUNCH("dequantize_blocks_kernel");
}

}  // namespace fp8tron::fp8
