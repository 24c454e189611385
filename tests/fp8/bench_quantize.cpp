// The FP8 cast kernels of one transformer layer on one GPU, each against the copy bandwidth of the
// same machine: how close a cast comes to moving its bytes at the speed a device-to-device copy
// moves them. The shapes are GPT 1.3B's (tokens 4 x 2048, hidden 2048, ffn 8192) unless given:
//
//   fp8tron_bench_quantize [iterations] [tokens hidden ffn]
//
// Each row: the cast as the FP8 linear layers issue it (delayed scaling, hybrid formats: E4M3
// forward, E5M2 gradients; the row-wise and the transposed copy, the amax into the history slot),
// its time (CUDA events around `iterations` back-to-back launches after warm-up), the bytes it must
// move (bf16 reads, fp8 writes), the bandwidth that makes, and that bandwidth over a
// cudaMemcpyAsync's of 1 GiB (which reads and writes, so its bytes count twice). 1.00 = the cast
// moves its bytes as fast as the copy does.
#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include <ATen/cuda/CUDAContext.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "core/cuda/cuda_check.h"
#include "fp8/call_timer.h"
#include "fp8/quantize.h"

namespace fp8tron::fp8 {
namespace {

int g_iters = 50;

CUstream_st* current() { return at::cuda::getCurrentCUDAStream().stream(); }

double time_ms(const std::function<void()>& fn) { return mean_call_ms(fn, g_iters, current()); }

const uint16_t* bits(const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); }

// GB/s of a device-to-device copy of 1 GiB, counting its read and its write.
double copy_bandwidth() {
  const int64_t n = int64_t(1) << 30;
  auto a = torch::empty({n}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8));
  auto b = torch::empty_like(a);
  const double ms = time_ms([&] {
    FP8TRON_CUDA_CHECK(cudaMemcpyAsync(b.data_ptr(), a.data_ptr(), size_t(n), cudaMemcpyDeviceToDevice, current()));
  });
  return 2.0 * double(n) / (ms * 1e-3) / 1e9;
}

struct Case {
  std::string name;
  int64_t rows, cols;
  Format format;
  Prologue prologue;
  bool column_sums;
};

void run(const Case& c, double copy_gbs) {
  const auto bf = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const auto f32 = bf.dtype(torch::kFloat32);
  const auto u8 = bf.dtype(torch::kUInt8);
  torch::manual_seed(1);
  // SwiGLU reads the gate and up halves of fc1's output, [rows, 2 cols]; its backward the gradient
  // of its output, [rows, cols / 2], and fc1's output (aux).
  const int64_t x_cols = c.prologue == Prologue::kSwiglu           ? 2 * c.cols
                         : c.prologue == Prologue::kSwigluBackward ? c.cols / 2
                                                                   : c.cols;
  const auto x = torch::randn({c.rows, x_cols}, bf);
  const auto aux = torch::randn({c.rows, c.cols}, bf);
  auto data = torch::empty({c.rows, c.cols}, u8), data_t = torch::empty({c.cols, c.rows}, u8);
  auto scale = torch::ones({1}, f32), scale_inv = torch::ones({1}, f32), amax = torch::zeros({1}, f32);
  auto sums = torch::zeros({c.cols}, f32);
  Fp8TensorView out;
  out.data = data.data_ptr();
  out.data_t = data_t.data_ptr();
  out.scale = scale.data_ptr<float>();
  out.scale_inv = scale_inv.data_ptr<float>();
  out.amax = amax.data_ptr<float>();
  out.format = c.format;
  out.rows = size_t(c.rows);
  out.cols = size_t(c.cols);
  TensorCastFusion fusion;
  fusion.prologue = c.prologue;
  if (c.prologue == Prologue::kGeluTanhBackward || c.prologue == Prologue::kSwigluBackward) fusion.aux = bits(aux);
  if (c.column_sums) fusion.column_sums = sums.data_ptr<float>();
  const double ms = time_ms([&] { quantize_tensor_delayed(bits(x), out, current(), fusion); });
  const double elements = double(c.rows) * double(c.cols);
  // bf16 in (+ aux), two fp8 copies out
  const double bytes = 2.0 * double(c.rows) * double(x_cols) + (fusion.aux ? 2.0 * elements : 0.0) + 2.0 * elements;
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("| %-34s | %6lld x %-6lld | %8.1f | %7.1f | %6.0f | %4.2f |\n", c.name.c_str(), (long long)c.rows,
              (long long)c.cols, ms * 1e3, bytes / 1e6, gbs, gbs / copy_gbs);
}

}  // namespace
}  // namespace fp8tron::fp8

int main(int argc, char** argv) {
  using namespace fp8tron::fp8;
  if (argc > 1) g_iters = std::atoi(argv[1]);
  int64_t tokens = 8192, hidden = 2048, ffn = 8192;
  if (argc > 4) {
    tokens = std::atoll(argv[2]);
    hidden = std::atoll(argv[3]);
    ffn = std::atoll(argv[4]);
  }
  const double copy_gbs = copy_bandwidth();
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n\n", copy_gbs);
  std::printf("| cast (delayed scaling, data + data_t + amax) | rows x cols | us | MB moved | GB/s | / copy |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  const Case cases[] = {
      {"E4M3 activation (qkv, fc1 input)", tokens, hidden, Format::kE4M3, Prologue::kNone, false},
      {"E4M3 GeLU(fc1 output) (fc2 input)", tokens, ffn, Format::kE4M3, Prologue::kGeluTanh, false},
      {"E4M3 SwiGLU(fc1 output) (fc2 input)", tokens, ffn, Format::kE4M3, Prologue::kSwiglu, false},
      {"E4M3 weight (fc1)", ffn, hidden, Format::kE4M3, Prologue::kNone, false},
      {"E5M2 grad + bias grad (fc2, proj)", tokens, hidden, Format::kE5M2, Prologue::kNone, true},
      {"E5M2 grad (no bias)", tokens, hidden, Format::kE5M2, Prologue::kNone, false},
      {"E5M2 GeLU backward + bias grad (fc1)", tokens, ffn, Format::kE5M2, Prologue::kGeluTanhBackward, true},
      {"E5M2 SwiGLU backward (fc1, 2 x ffn)", tokens, 2 * ffn, Format::kE5M2, Prologue::kSwigluBackward, false},
      {"E5M2 grad (fc1, 2 x ffn: SwiGLU unfused)", tokens, 2 * ffn, Format::kE5M2, Prologue::kNone, false},
      {"E5M2 grad + bias grad (qkv)", tokens, 3 * hidden, Format::kE5M2, Prologue::kNone, true},
  };
  for (const Case& c : cases) run(c, copy_gbs);
  return 0;
}
