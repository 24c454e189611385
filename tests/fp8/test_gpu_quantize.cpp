// GPU quantize kernels against the CPU reference, bit for bit: every bf16 bit pattern through the
// hardware casts, random tensors through every kernel and mode (edge tiles included), the device
// delayed-scaling update, and the kernels' bandwidth on a 16384 x 2048 bf16 tensor (printed as
// "[fp8-bench] ..." lines; the fused cast+transpose must reach 2.5 TB/s effective).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "fp8/format_codec.h"
#include "fp8/formats.h"
#include "fp8/quantize.h"
#include "fp8/quantize_reference.h"
#include "fp8/scaling_state.h"
#include "gpu_test_util.h"

namespace fp8tron::fp8 {
namespace {

using testing::DeviceBuffer;
using testing::DeviceQuantized;
using testing::HostQuantized;
using testing::random_bf16;

// Compares codes; where the input was NaN only NaN-ness is required (the hardware may pick another
// NaN encoding than the reference's canonical one). Returns the number of mismatches.
size_t compare_codes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, Format f,
                     const std::string& what, size_t* nan_encoding_differences = nullptr) {
  EXPECT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] == want[i]) continue;
    if (is_nan_code(f, want[i]) && is_nan_code(f, got[i])) {
      if (nan_encoding_differences) ++*nan_encoding_differences;
      continue;
    }
    if (bad < 5) {
      ADD_FAILURE() << what << ": element " << i << " GPU 0x" << std::hex << int(got[i]) << " CPU 0x" << int(want[i]);
    }
    ++bad;
  }
  EXPECT_EQ(bad, 0u) << what;
  return bad;
}

void compare_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && bad++ < 5) {
      ADD_FAILURE() << what << ": byte " << i << " GPU 0x" << std::hex << int(got[i]) << " CPU 0x" << int(want[i]);
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

void compare_all(const HostQuantized& gpu, const HostQuantized& cpu, const std::string& what) {
  compare_codes(gpu.data, cpu.data, cpu.view.format, what + " data");
  compare_codes(gpu.data_t, cpu.data_t, cpu.view.format, what + " data_t");
  compare_bytes(gpu.scale_inv, cpu.scale_inv, what + " scale_inv");
  compare_bytes(gpu.scale_inv_t, cpu.scale_inv_t, what + " scale_inv_t");
  EXPECT_EQ(codec::float_bits(gpu.scale), codec::float_bits(cpu.scale)) << what << " scale";
  EXPECT_EQ(codec::float_bits(gpu.amax), codec::float_bits(cpu.amax)) << what << " amax";
}

std::string name(const char* kind, Format f, size_t rows, size_t cols, bool rowwise, bool transposed) {
  return std::string(kind) + " " + format_name(f) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
         (rowwise ? " rowwise" : "") + (transposed ? " transposed" : "");
}

struct Shape {
  size_t rows, cols;
};
// Full tiles, partial tiles on both edges, a single 16x16 tile, a tall one.
const Shape kShapes[] = {{256, 512}, {400, 272}, {16, 16}, {2048, 1040}};

TEST(GpuQuantize, HardwareCastsMatchTheCodecOnEveryBf16Pattern) {
  FP8_REQUIRE_GPU();
  std::vector<uint16_t> x(65536);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(i);
  DeviceBuffer<uint16_t> dx(x);
  for (Format f : {Format::kE4M3, Format::kE5M2, Format::kHiF8}) {
    for (float scale : {1.0f, 0.0123f, 300.0f}) {
      for (bool transposed : {false, true}) {
        HostQuantized cpu(ScalingMode::kTensor, f, 256, 256, true, transposed);
        cpu.scale = scale;
        reference::quantize_tensor_delayed(x.data(), cpu.view);
        HostQuantized gpu(ScalingMode::kTensor, f, 256, 256, true, transposed);
        gpu.scale = scale;
        DeviceQuantized dq(gpu);
        quantize_tensor_delayed(dx.get(), dq.view, nullptr);
        FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
        dq.download_into(gpu);
        size_t nan_diffs = 0;
        const std::string what = name("all-bf16", f, 256, 256, true, transposed) + " scale " + std::to_string(scale);
        compare_codes(gpu.data, cpu.data, f, what, &nan_diffs);
        compare_codes(gpu.data_t, cpu.data_t, f, what + " data_t", &nan_diffs);
        // The amax rule (scale_math.h): NaN inputs are ignored, the infs make the amax +inf.
        EXPECT_EQ(codec::float_bits(gpu.amax), codec::kF32Inf) << what;
        EXPECT_EQ(codec::float_bits(gpu.amax), codec::float_bits(cpu.amax)) << what;
        EXPECT_EQ(gpu.sinv(0), cpu.sinv(0)) << what;
        if (nan_diffs) std::printf("[fp8-info] %s: %zu NaN inputs got another NaN encoding\n", what.c_str(), nan_diffs);
      }
    }
  }
}

TEST(GpuQuantize, AmaxMatchesReference) {
  FP8_REQUIRE_GPU();
  for (size_t n : {size_t{1}, size_t{7}, size_t{4096}, size_t{1000003}}) {
    const auto x = random_bf16(n, 11, 2.0f, 6);
    DeviceBuffer<uint16_t> dx(x);
    DeviceBuffer<float> amax(1, 0);
    amax_bf16(dx.get(), n, amax.get(), nullptr);
    EXPECT_EQ(amax.download()[0], reference::amax_bf16(x.data(), n)) << n;
    if (n > 1) {  // misaligned start: the scalar path
      DeviceBuffer<float> amax2(1, 0);
      amax_bf16(dx.get() + 1, n - 1, amax2.get(), nullptr);
      EXPECT_EQ(amax2.download()[0], reference::amax_bf16(x.data() + 1, n - 1)) << n << " misaligned";
    }
  }
}

TEST(GpuQuantize, DelayedCastMatchesReference) {
  FP8_REQUIRE_GPU();
  uint32_t seed = 100;
  for (const Shape& s : kShapes) {
    const auto x = random_bf16(s.rows * s.cols, ++seed, 1.0f, 8);
    DeviceBuffer<uint16_t> dx(x);
    for (Format f : {Format::kE4M3, Format::kE5M2, Format::kHiF8}) {
      for (auto [rowwise, transposed] : {std::pair{true, false}, std::pair{true, true}, std::pair{false, true}}) {
        HostQuantized cpu(ScalingMode::kTensor, f, s.rows, s.cols, rowwise, transposed);
        cpu.scale = max_finite(f) / 700.0f;
        cpu.amax = 0.25f;  // accumulates
        HostQuantized gpu(ScalingMode::kTensor, f, s.rows, s.cols, rowwise, transposed);
        gpu.scale = cpu.scale;
        gpu.amax = cpu.amax;
        reference::quantize_tensor_delayed(x.data(), cpu.view);
        DeviceQuantized dq(gpu);
        quantize_tensor_delayed(dx.get(), dq.view, nullptr);
        dq.download_into(gpu);
        compare_all(gpu, cpu, name("delayed", f, s.rows, s.cols, rowwise, transposed));
      }
    }
  }
  // A flat tensor whose size is not a multiple of 16 (row-wise only, vector + scalar tail).
  const auto x = random_bf16(1000003, 7);
  DeviceBuffer<uint16_t> dx(x);
  HostQuantized cpu(ScalingMode::kTensor, Format::kE4M3, 1, 1000003, true, false);
  HostQuantized gpu(ScalingMode::kTensor, Format::kE4M3, 1, 1000003, true, false);
  cpu.scale = gpu.scale = 97.0f;
  reference::quantize_tensor_delayed(x.data(), cpu.view);
  DeviceQuantized dq(gpu);
  quantize_tensor_delayed(dx.get(), dq.view, nullptr);
  dq.download_into(gpu);
  compare_all(gpu, cpu, "delayed flat 1000003");
}

TEST(GpuQuantize, CurrentScalingMatchesReference) {
  FP8_REQUIRE_GPU();
  uint32_t seed = 200;
  for (const Shape& s : kShapes) {
    const auto x = random_bf16(s.rows * s.cols, ++seed, 3.0f, 4);
    DeviceBuffer<uint16_t> dx(x);
    for (Format f : {Format::kE4M3, Format::kE5M2, Format::kHiF8}) {
      for (CurrentScalingOptions opt : {CurrentScalingOptions{}, CurrentScalingOptions{true, 1e-3f}}) {
        for (bool transposed : {false, true}) {
          HostQuantized cpu(ScalingMode::kTensor, f, s.rows, s.cols, true, transposed);
          HostQuantized gpu(ScalingMode::kTensor, f, s.rows, s.cols, true, transposed);
          reference::quantize_tensor_current(x.data(), cpu.view, opt);
          DeviceQuantized dq(gpu);
          quantize_tensor_current(dx.get(), dq.view, opt, nullptr);
          dq.download_into(gpu);
          compare_all(gpu, cpu, name(opt.power_2_scales ? "current pow2" : "current", f, s.rows, s.cols, true, transposed));
        }
      }
    }
  }
}

TEST(GpuQuantize, BlockwiseMatchesReference) {
  FP8_REQUIRE_GPU();
  uint32_t seed = 300;
  for (const Shape& s : kShapes) {
    const auto x = random_bf16(s.rows * s.cols, ++seed, 1.0f, 10);
    DeviceBuffer<uint16_t> dx(x);
    for (ScalingMode mode : {ScalingMode::kBlock1x128, ScalingMode::kBlock128x128}) {
      for (Format f : {Format::kE4M3, Format::kE5M2}) {
        for (BlockScalingOptions opt : {BlockScalingOptions{}, BlockScalingOptions{false, 1e-4f}}) {
          for (auto [rowwise, transposed] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
            HostQuantized cpu(mode, f, s.rows, s.cols, rowwise, transposed);
            HostQuantized gpu(mode, f, s.rows, s.cols, rowwise, transposed);
            reference::quantize_blockwise(x.data(), cpu.view, opt);
            DeviceQuantized dq(gpu);
            quantize_blockwise(dx.get(), dq.view, opt, nullptr);
            dq.download_into(gpu);
            compare_all(gpu, cpu,
                        name(scaling_mode_name(mode), f, s.rows, s.cols, rowwise, transposed) +
                            (opt.power_2_scales ? " pow2" : " fp32-scales"));
          }
        }
      }
    }
  }
}

TEST(GpuQuantize, Mxfp8MatchesReference) {
  FP8_REQUIRE_GPU();
  uint32_t seed = 400;
  for (const Shape& s : kShapes) {
    const auto x = random_bf16(s.rows * s.cols, ++seed, 1.0f, 12);
    DeviceBuffer<uint16_t> dx(x);
    for (Format f : {Format::kE4M3, Format::kE5M2}) {
      for (auto [rowwise, transposed] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
        HostQuantized cpu(ScalingMode::kMxfp8, f, s.rows, s.cols, rowwise, transposed);
        HostQuantized gpu(ScalingMode::kMxfp8, f, s.rows, s.cols, rowwise, transposed);
        reference::quantize_mxfp8(x.data(), cpu.view);
        DeviceQuantized dq(gpu);
        quantize_mxfp8(dx.get(), dq.view, nullptr);
        dq.download_into(gpu);
        compare_all(gpu, cpu, name("mxfp8", f, s.rows, s.cols, rowwise, transposed));
      }
    }
  }
  // A tensor of zeros: every E8M0 scale is 0x00 (2^-127) and every code 0.
  std::vector<uint16_t> zeros(64 * 64, 0);
  DeviceBuffer<uint16_t> dz(zeros);
  HostQuantized cpu(ScalingMode::kMxfp8, Format::kE4M3, 64, 64), gpu(ScalingMode::kMxfp8, Format::kE4M3, 64, 64);
  reference::quantize_mxfp8(zeros.data(), cpu.view);
  DeviceQuantized dq(gpu);
  quantize_mxfp8(dz.get(), dq.view, nullptr);
  dq.download_into(gpu);
  compare_all(gpu, cpu, "mxfp8 zeros");
}

TEST(GpuQuantize, DequantizeMatchesReference) {
  FP8_REQUIRE_GPU();
  const Shape s{400, 272};
  const auto x = random_bf16(s.rows * s.cols, 500, 1.0f, 6);
  struct Mode {
    ScalingMode mode;
    Format format;
  };
  for (Mode m : {Mode{ScalingMode::kTensor, Format::kE4M3}, Mode{ScalingMode::kTensor, Format::kE5M2},
                 Mode{ScalingMode::kTensor, Format::kHiF8}, Mode{ScalingMode::kBlock1x128, Format::kE4M3},
                 Mode{ScalingMode::kBlock128x128, Format::kE4M3}, Mode{ScalingMode::kMxfp8, Format::kE4M3},
                 Mode{ScalingMode::kMxfp8, Format::kE5M2}}) {
    HostQuantized q(m.mode, m.format, s.rows, s.cols);
    if (m.mode == ScalingMode::kTensor) {
      reference::quantize_tensor_current(x.data(), q.view, {});
    } else if (m.mode == ScalingMode::kMxfp8) {
      reference::quantize_mxfp8(x.data(), q.view);
    } else {
      reference::quantize_blockwise(x.data(), q.view, {});
    }
    DeviceBuffer<uint8_t> data(q.data), data_t(q.data_t), sinv(q.scale_inv), sinv_t(q.scale_inv_t);
    Fp8TensorView v = q.view;
    v.data = data.get();
    v.data_t = data_t.get();
    v.scale_inv = sinv.get();
    v.scale_inv_t = m.mode == ScalingMode::kTensor ? nullptr : sinv_t.get();
    for (bool transposed : {false, true}) {
      std::vector<uint16_t> want(x.size());
      reference::dequantize(q.view, transposed, want.data());
      DeviceBuffer<uint16_t> y(x.size(), 0xEE);
      dequantize(v, transposed, y.get(), nullptr);
      const auto got = y.download();
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
      EXPECT_EQ(bad, 0u) << "dequantize " << scaling_mode_name(m.mode) << " " << format_name(m.format)
                         << (transposed ? " transposed" : "");
    }
  }
}

TEST(GpuQuantize, DelayedScalingUpdateKernelMatchesCpu) {
  FP8_REQUIRE_GPU();
  const size_t gemms = 37, slots = gemms * 5, len = 16;
  std::mt19937 gen(600);
  std::uniform_real_distribution<float> u(0.0f, 100.0f);
  for (AmaxComputeAlgo algo : {AmaxComputeAlgo::kMax, AmaxComputeAlgo::kMostRecent}) {
    std::vector<float> history(len * slots), scale(slots), scale_inv(slots);
    for (auto& h : history) h = u(gen);
    for (auto& sc : scale) sc = u(gen);
    for (size_t s = 0; s < slots; s += 7) history[s] = 0.0f;  // no data this step
    history[3] = std::numeric_limits<float>::infinity();
    history[5] = std::numeric_limits<float>::quiet_NaN();
    history[9] = 1e-40f;
    DelayedScaling recipe;
    recipe.amax_history_len = static_cast<int>(len);
    recipe.amax_compute_algo = algo;
    recipe.margin = 1;
    const DelayedUpdateParams params = delayed_update_params(recipe, gemms);
    DeviceBuffer<float> dh(history), ds(scale), dsi(scale_inv);
    update_delayed_scaling_cpu({history.data(), scale.data(), scale_inv.data(), len, slots}, params);
    update_delayed_scaling_cuda({dh.get(), ds.get(), dsi.get(), len, slots}, params, nullptr);
    const auto gh = dh.download(), gs = ds.download(), gsi = dsi.download();
    for (size_t i = 0; i < history.size(); ++i) {
      EXPECT_EQ(codec::float_bits(gh[i]), codec::float_bits(history[i])) << "history " << i;
    }
    for (size_t i = 0; i < slots; ++i) {
      EXPECT_EQ(gs[i], scale[i]) << "scale " << i;
      EXPECT_EQ(gsi[i], scale_inv[i]) << "scale_inv " << i;
    }
  }
}

// Bandwidth of each kernel on a 16384 x 2048 bf16 tensor (64 MiB). Effective bandwidth counts the
// bytes a kernel must move: bf16 in, codes (and scales) out.
TEST(GpuQuantize, Bandwidth16384x2048) {
  FP8_REQUIRE_GPU();
  const size_t rows = 16384, cols = 2048, n = rows * cols;
  const auto x = random_bf16(n, 700, 1.0f, 4);
  DeviceBuffer<uint16_t> dx(x);
  DeviceBuffer<uint8_t> out(n), out_t(n);
  DeviceBuffer<float> scale(std::vector<float>{1.0f}), scale_inv(1), amax(1, 0);
  DeviceBuffer<float> bsinv(scale_layout(ScalingMode::kBlock1x128, rows, cols).elements()),
      bsinv_t(scale_layout(ScalingMode::kBlock1x128, cols, rows).elements());
  DeviceBuffer<uint8_t> msinv(scale_layout(ScalingMode::kMxfp8, rows, cols).elements()),
      msinv_t(scale_layout(ScalingMode::kMxfp8, cols, rows).elements());
  DeviceBuffer<uint16_t> y(n);

  Fp8TensorView t;
  t.rows = rows;
  t.cols = cols;
  t.format = Format::kE4M3;
  t.scale = scale.get();
  t.scale_inv = scale_inv.get();
  t.amax = amax.get();

  const double in_bytes = 2.0 * n;
  auto report = [&](const char* what, double ms, double bytes, double target_gbs = 0) {
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    std::printf("[fp8-bench] %-44s %8.1f us  %7.0f GB/s effective%s\n", what, ms * 1e3, gbs,
                target_gbs > 0 ? (gbs >= target_gbs ? "  (target 2500: met)" : "  (target 2500: MISSED)") : "");
    return gbs;
  };
  std::printf("[fp8-bench] device: %s, tensor %zux%zu bf16\n", testing::device_name().c_str(), rows, cols);

  report("amax", testing::time_ms([&] { amax_bf16(dx.get(), n, amax.get(), nullptr); }), in_bytes);

  Fp8TensorView rowwise = t;
  rowwise.data = out.get();
  report("delayed cast E4M3 (row-wise, + amax)",
         testing::time_ms([&] { quantize_tensor_delayed(dx.get(), rowwise, nullptr); }), in_bytes + n);

  Fp8TensorView both = rowwise;
  both.data_t = out_t.get();
  const double cast_transpose_gbs =
      report("delayed cast+transpose E4M3 (+ amax)",
             testing::time_ms([&] { quantize_tensor_delayed(dx.get(), both, nullptr); }), in_bytes + 2.0 * n, 2500);
  EXPECT_GE(cast_transpose_gbs, 2500.0) << "fused cast+transpose below the 2.5 TB/s target";

  Fp8TensorView both_e5 = both;
  both_e5.format = Format::kE5M2;
  report("delayed cast+transpose E5M2 (+ amax)",
         testing::time_ms([&] { quantize_tensor_delayed(dx.get(), both_e5, nullptr); }), in_bytes + 2.0 * n);

  report("current scaling E4M3 (amax pass + cast+transpose)",
         testing::time_ms([&] { quantize_tensor_current(dx.get(), both, {}, nullptr); }), 2 * in_bytes + 2.0 * n);

  Fp8TensorView hif8 = rowwise;
  hif8.format = Format::kHiF8;
  report("current scaling HiF8 (row-wise, emulation)",
         testing::time_ms([&] { quantize_tensor_current(dx.get(), hif8, {}, nullptr); }), 2 * in_bytes + n);

  Fp8TensorView b1 = both;
  b1.scaling_mode = ScalingMode::kBlock1x128;
  b1.scale_inv = bsinv.get();
  b1.scale_inv_t = bsinv_t.get();
  report("blockwise 1x128 E4M3, both copies",
         testing::time_ms([&] { quantize_blockwise(dx.get(), b1, {}, nullptr); }),
         in_bytes + 2.0 * n + 4.0 * (bsinv.size() + bsinv_t.size()));

  Fp8TensorView b2 = b1;
  b2.scaling_mode = ScalingMode::kBlock128x128;
  report("blockwise 128x128 E4M3, both copies",
         testing::time_ms([&] { quantize_blockwise(dx.get(), b2, {}, nullptr); }), in_bytes + 2.0 * n);

  Fp8TensorView mx = both;
  mx.scaling_mode = ScalingMode::kMxfp8;
  mx.scale_inv = msinv.get();
  mx.scale_inv_t = msinv_t.get();
  report("mxfp8 E4M3, both copies", testing::time_ms([&] { quantize_mxfp8(dx.get(), mx, nullptr); }),
         in_bytes + 2.0 * n + msinv.size() + msinv_t.size());

  report("dequantize E4M3 tensor -> bf16", testing::time_ms([&] { dequantize(rowwise, false, y.get(), nullptr); }),
         n + in_bytes);
  report("dequantize mxfp8 -> bf16", testing::time_ms([&] { dequantize(mx, false, y.get(), nullptr); }),
         n + in_bytes + msinv.size());

  // Reference point: a device-to-device copy of the bf16 tensor.
  report("cudaMemcpy D2D (reference)", testing::time_ms([&] {
           FP8TRON_CUDA_CHECK(cudaMemcpyAsync(y.get(), dx.get(), 2 * n, cudaMemcpyDeviceToDevice, nullptr));
         }),
         2 * in_bytes);
  FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace fp8tron::fp8
