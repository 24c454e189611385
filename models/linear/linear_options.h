// What a Transformer-Engine-named linear module is built from (its sizes, bias, initialisation and
// name) and the helpers every one of them uses: the layer number and per-layer index its name
// encodes, the FP8 site the model's engine gives it, the parameter descriptions of a shard.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>

#include "models/module_factory.h"
#include "parallel/sharding.h"

namespace fp8tron {

namespace fp8 {
struct Fp8Site;
}

// The global layer number in a module's name ("decoder.layers.12.mlp.linear_fc1" -> 12); -1
// outside the transformer layers. FP8 sites use it for --first-last-layers-bf16.
int64_t layer_number(const std::string& name);
// The entry of a per-layer list (--cp-comm-type) a module's attention takes: the decoder layer's
// number, and for the multi-token-prediction layer of depth k ("mtp.layers.k.") k, as Megatron
// numbers its MTP layers 1, 2, ... like the first decoder layers. 0 elsewhere.
int64_t per_layer_index(const std::string& name);

struct LinearOptions {
  int64_t in_features = 0;   // global sizes
  int64_t out_features = 0;
  bool bias = true;
  double init_std = 0.02;
  int interleave = 1;        // column-parallel: output blocks split separately (SwiGLU's gate|up)
  std::string init_name;     // full parameter-name prefix, seeds the initialisation
  bool external_weight = false;  // the weight is passed to forward_with (tied output layer)
  bool fp8 = true;               // may run in FP8 (the output layer stays bf16, as in Megatron)
  bool defer_bias = false;       // row-parallel: its caller may leave the bias to the next norm
  // --delay-wgrad-compute holds its weight gradient (Megatron's TE linears do; the output layer,
  // a plain ColumnParallelLinear there, does not).
  bool delay_wgrad = true;
};

// A replicated parameter (partial_grads: each tensor-parallel rank holds a partial gradient to sum
// over the group) and one split along `dim` over the tensor-parallel ranks.
ParamInfo replicated_param(std::vector<int64_t> shape, bool partial_grads);
ParamInfo split_param(std::vector<int64_t> shape, int dim, int interleave = 1);

// The linear's FP8 site from the model's engine ([out, in] are this rank's features), or null for
// bf16 GEMMs: no engine, the layer stays bf16 (`o.fp8`), or the engine keeps it bf16 (its size or
// layer, fp8/fp8_linear.h).
std::shared_ptr<fp8::Fp8Site> fp8_site_for(const LinearOptions& o, const ModuleFactory& f, int64_t out, int64_t in);

// --delay-wgrad-compute (models/linear/main_grads.h): registers the weight whose gradient the
// model's queue holds and hands the queue to its FP8 site (null: none); on the bf16 path also the
// bias, whose gradient the held GEMM may produce (models/linear/wgrad_deferral.h). No-op without
// the flag or with `delay` false.
void hold_wgrad(bool delay, const ModuleFactory& f, const torch::Tensor& weight, fp8::Fp8Site* site,
                const torch::Tensor& bias = {});

}  // namespace fp8tron
