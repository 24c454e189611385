// What the model's modules are built with: parallel/'s ParamFactory (weights drawn from the seed
// and their global name, sliced to this rank's tensor-parallel shard) plus the FP8 engine that
// the linear layers register their FP8 sites with. parallel/ knows nothing of FP8; the pairing
// happens here, in the layer that uses both.
#pragma once
#include <memory>
#include <utility>

#include "parallel/context_parallel.h"
#include "parallel/sharding.h"

namespace fp8tron {
namespace fp8 {
class Fp8Engine;
}

class ModuleFactory : public ParamFactory {
 public:
  ModuleFactory(uint64_t seed, TensorParallelContext tp, std::shared_ptr<fp8::Fp8Engine> fp8 = nullptr,
                ContextParallelContext cp = {})
      : ParamFactory(seed, std::move(tp)), fp8_(std::move(fp8)), cp_(std::move(cp)) {}
  // The FP8 engine linear layers register with (null: bf16 model).
  const std::shared_ptr<fp8::Fp8Engine>& fp8() const { return fp8_; }
  // Context parallelism (attention, positions); disabled by default.
  const ContextParallelContext& cp() const { return cp_; }

 private:
  std::shared_ptr<fp8::Fp8Engine> fp8_;
  ContextParallelContext cp_;
};

}  // namespace fp8tron
