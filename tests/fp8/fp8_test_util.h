// Helpers shared by the FP8 tests: random bf16 data and host buffers for one quantized tensor.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "fp8/format_codec.h"
#include "fp8/fp8_tensor.h"

namespace fp8tron::fp8::testing {

// Normal(0, stddev) values rounded to bf16; with `spread`, each 16-element run is additionally
// scaled by a power of two in [2^-spread, 2^spread] so blocks see very different magnitudes.
inline std::vector<uint16_t> random_bf16(size_t n, uint32_t seed, float stddev = 1.0f, int spread = 0) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::uniform_int_distribution<int> exp(-spread, spread);
  std::vector<uint16_t> x(n);
  float factor = 1.0f;
  for (size_t i = 0; i < n; ++i) {
    if (spread > 0 && i % 16 == 0) factor = std::ldexp(1.0f, exp(gen));
    x[i] = codec::float_to_bf16(dist(gen) * factor);
  }
  return x;
}

// Host memory for one quantized tensor, with a view pointing into it. Untouched bytes are 0xEE
// so that a kernel that forgets to write something is caught.
struct HostQuantized {
  std::vector<uint8_t> data, data_t;
  std::vector<uint8_t> scale_inv, scale_inv_t;  // raw bytes (fp32 or E8M0)
  float scale = 1.0f, amax = 0.0f;
  Fp8TensorView view;

  HostQuantized(ScalingMode mode, Format format, size_t rows, size_t cols, bool rowwise = true, bool transposed = true) {
    view.format = format;
    view.scaling_mode = mode;
    view.rows = rows;
    view.cols = cols;
    if (rowwise) data.assign(rows * cols, 0xEE);
    if (transposed) data_t.assign(rows * cols, 0xEE);
    scale_inv.assign(view.layout().bytes(), 0xEE);
    scale_inv_t.assign(view.layout_t().bytes(), 0xEE);
    view.data = rowwise ? data.data() : nullptr;
    view.data_t = transposed ? data_t.data() : nullptr;
    view.scale = &scale;
    view.amax = &amax;
    view.scale_inv = scale_inv.data();
    view.scale_inv_t = mode == ScalingMode::kTensor ? nullptr : scale_inv_t.data();
  }
  HostQuantized(const HostQuantized&) = delete;
  HostQuantized& operator=(const HostQuantized&) = delete;

  float sinv(size_t i) const { return reinterpret_cast<const float*>(scale_inv.data())[i]; }
  float sinv_t(size_t i) const { return reinterpret_cast<const float*>(scale_inv_t.data())[i]; }
};

}  // namespace fp8tron::fp8::testing
