// --fp8-param-gather's casts (trainer/fp8_param_gather.h) against fp8/'s reference quantizer: the
// codes of x * scale and their dequantized values must be those of quantize_tensor_delayed /
// dequantize_to_float, bit for bit, over normal, subnormal, saturating, tie and signed-zero values.
#include <gtest/gtest.h>

#include "fp8/quantize_reference.h"
#include "trainer/fp8_param_gather.h"

namespace fp8tron {
namespace {

TEST(Fp8ParamCast, CodesAndValuesEqualTheReferenceQuantizer) {
  for (fp8::Format format : {fp8::Format::kE4M3, fp8::Format::kE5M2}) {
    for (float scale : {1.0f, 3.0e2f, 7.5e-3f, 1.0e5f}) {
      torch::manual_seed(3);
      // bf16 values (what the reference reads), spread over many binades, with exact zeros of both
      // signs, and values that saturate after scaling.
      auto x = (torch::randn({4096}) * torch::pow(2.0, torch::randint(-24, 8, {4096}).to(torch::kFloat32)))
                   .to(torch::kBFloat16)
                   .to(torch::kFloat32);
      x[0] = 0.0f;
      x[1] = -0.0f;
      x[2] = 1e30f;
      x[3] = -1e30f;
      auto s = torch::full({1}, scale);
      auto codes = cast_to_fp8_codes(x, s, format);
      auto xb = x.to(torch::kBFloat16).contiguous();
      auto want = torch::empty({4096}, torch::kUInt8);
      auto inv = torch::empty({1});
      fp8::Fp8TensorView v;
      v.format = format;
      v.rows = 1;
      v.cols = 4096;
      v.data = want.data_ptr();
      v.scale = s.data_ptr<float>();
      v.scale_inv = inv.data_ptr();
      fp8::reference::quantize_tensor_delayed(static_cast<const uint16_t*>(xb.data_ptr()), v);
      EXPECT_TRUE(torch::equal(codes, want)) << fp8::format_name(format) << " scale " << scale << ": "
                                             << (codes != want).sum().item<int64_t>() << " codes differ";
      auto values = decode_fp8_codes(codes, inv, format, torch::kFloat32);
      auto ref = torch::empty({4096});
      fp8::reference::dequantize_to_float(v, false, ref.data_ptr<float>());
      EXPECT_TRUE(torch::equal(values, ref)) << fp8::format_name(format) << " scale " << scale;
    }
  }
}

}  // namespace
}  // namespace fp8tron
