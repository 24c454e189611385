// --fp8-param-gather (Megatron's fp8_param with the distributed optimizer): the FP8 linears'
// weights are published by the optimizer as FP8 codes, one byte per element, so the
// data-parallel all-gather of the parameters moves half the bytes of bf16. After each step every
// rank casts its shard of the fp32 main weights straight to FP8 (not through bf16), as Megatron's
// quantize_param_shard / Transformer Engine's cast_master_weights_to_fp8:
//   delayed     with the weight's current scale; the shards' amaxes are MAX-reduced over the
//               data-parallel group (one packed all-reduce) and recorded as the weight's amax
//   tensorwise  the shards' amaxes MAX-reduced over the group, the scale taken from the result
// The gathered codes become the FP8 site's weight for the step (no re-quantization) and the model
// parameters hold their dequantized values (what an FP8 parameter is). Checkpoints are unchanged:
// the fp32 main weights are what a resumed run continues from. Blockwise, MXFP8 and HiF8 are
// refused (validation.cpp). The casts use torch's float8 dtypes (round to nearest even, after
// clamping to the format's range: the saturating cast of fp8/quantize.h).
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "fp8/fp8_linear.h"
#include "optim/mixed_precision_optimizer.h"

namespace fp8tron {

class Fp8ParamGather {
 public:
  Fp8ParamGather(std::shared_ptr<fp8::Fp8Engine> engine);
  // The weights published as bytes (the FP8 sites' parameters), for the optimizer's constructor.
  std::vector<torch::Tensor> params() const;
  // The encode/decode functions over one optimizer domain's flat buffer (call after the optimizer
  // is built): the dense weights' amaxes reduce over the data-parallel group, the experts' over the
  // expert data-parallel group (the ranks holding shards of the same experts).
  BytePublish publish(const OptimizerDomain& domain);
  // "N FP8 weights in the dense domain, M in the expert domain" (this rank's), for the log.
  std::string describe() const;

 private:
  struct Entry {
    std::shared_ptr<fp8::Fp8Site> site;
    int64_t offset = 0, numel = 0;  // in the domain's flat buffer
    torch::Tensor scale_inv;        // [1] fp32: of the codes last encoded
  };
  struct DomainWeights {
    std::vector<Entry> entries;  // in buffer order
    std::shared_ptr<Communicator> group;
    std::string name;  // the domain's
  };
  void encode(DomainWeights& d, const torch::Tensor& main, torch::Tensor& codes, int64_t offset);
  void decode(DomainWeights& d, const torch::Tensor& codes, int64_t offset, int64_t numel);

  std::shared_ptr<fp8::Fp8Engine> engine_;
  std::vector<std::unique_ptr<DomainWeights>> domains_;
};

// The FP8 codes of x * scale, saturated to the format's range and rounded to nearest even
// (uint8, x's shape); `scale` is a 1-element fp32 tensor. E4M3 and E5M2.
torch::Tensor cast_to_fp8_codes(const torch::Tensor& x, const torch::Tensor& scale, fp8::Format format);
// decode(codes) * scale_inv in fp32, rounded once to `dtype` (bf16: fp8/quantize.h's dequantize).
torch::Tensor decode_fp8_codes(const torch::Tensor& codes, const torch::Tensor& scale_inv, fp8::Format format,
                               torch::ScalarType dtype);

}  // namespace fp8tron
