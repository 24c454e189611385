// Block-scaled casts: blockwise scaling (1x128 and 128x128 blocks, fp32 scales, DeepSeek-V3's
// recipe) and MXFP8 (1x32 blocks, E8M0 scales), both through the shared tile kernel.
#include "fp8/quantize_tile.cuh"

namespace fp8tron::fp8 {
using namespace cast;

namespace {

// The arguments every block-scaled tile cast shares (checks included); false when x is empty.
bool block_tile_args(const uint16_t* x, const Fp8TensorView& out, const char* name, TileArgs& args) {
  check_element_format(out.format, false);
  FP8TRON_CHECK(out.data != nullptr || out.data_t != nullptr, "quantize: neither data nor data_t given");
  FP8TRON_CHECK(out.data == nullptr || out.scale_inv != nullptr, std::string(name) + ": data needs scale_inv");
  FP8TRON_CHECK(out.data_t == nullptr || out.scale_inv_t != nullptr, std::string(name) + ": data_t needs scale_inv_t");
  if (out.numel() == 0) return false;
  args = whole_tensor_tile_args(x, out);
  args.scale_inv = out.scale_inv;
  args.scale_inv_t = out.scale_inv_t;
  args.ld = out.layout().ld;
  args.ld_t = out.layout_t().ld;
  return true;
}

}  // namespace

void quantize_blockwise(const uint16_t* x, const Fp8TensorView& out, const BlockScalingOptions& options,
                        CudaStream stream) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kBlock1x128 || out.scaling_mode == ScalingMode::kBlock128x128,
                "quantize_blockwise needs a 1x128 or 128x128 scaling mode");
  TileArgs args;
  if (!block_tile_args(x, out, "quantize_blockwise", args)) return;
  args.fp8_max = max_finite(out.format);
  args.power_2 = options.power_2_scales;
  args.epsilon = options.amax_epsilon;
  if (out.scaling_mode == ScalingMode::kBlock1x128) {
    dispatch_tile<TileMode::kBlock1x128>(out.format, args, stream);
  } else {
    dispatch_tile<TileMode::kBlock128x128>(out.format, args, stream);
  }
}

void quantize_mxfp8(const uint16_t* x, const Fp8TensorView& out, CudaStream stream) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kMxfp8, "quantize_mxfp8 needs the MXFP8 scaling mode");
  TileArgs args;
  if (!block_tile_args(x, out, "quantize_mxfp8", args)) return;
  args.fp8_max_rcp = 1.0f / max_finite(out.format);
  dispatch_tile<TileMode::kMx>(out.format, args, stream);
}

}  // namespace fp8tron::fp8
