// What the model's modules are built with: parallel/'s ParamFactory (weights drawn from the seed
// and their global name, sliced to this rank's tensor-parallel shard), the FP8 engine that the
// linear layers register their FP8 sites with, and how their kernels treat the fp32 main gradients
// (models/linear/main_grads.h). parallel/ knows nothing of FP8; the pairing happens here, in the
// layer that uses both. Every setting the modules' kernels follow comes from here, none from
// process-wide state: two models built with different factories behave each as its own says.
#pragma once
#include <memory>
#include <utility>

#include "models/linear/main_grads.h"
#include "parallel/context_parallel.h"
#include "parallel/sharding.h"

namespace fp8tron {
namespace fp8 {
class Fp8Engine;
}
class ActivationOffloader;

class ModuleFactory : public ParamFactory {
 public:
  ModuleFactory(uint64_t seed, TensorParallelContext tp, std::shared_ptr<fp8::Fp8Engine> fp8 = nullptr,
                ContextParallelContext cp = {}, MainGradsPtr main_grads = make_main_grads())
      : ParamFactory(seed, std::move(tp)), fp8_(std::move(fp8)), cp_(std::move(cp)), main_grads_(std::move(main_grads)) {}
  // The FP8 engine linear layers register with (null: bf16 model).
  const std::shared_ptr<fp8::Fp8Engine>& fp8() const { return fp8_; }
  // Context parallelism (attention, positions); disabled by default.
  const ContextParallelContext& cp() const { return cp_; }
  // Gradient-accumulation fusion and the wgrad GEMMs' first writes of this model.
  const MainGradsPtr& main_grads() const { return main_grads_; }
  // Where the modules hand the activations --offload-modules names (null: none offloaded).
  const std::shared_ptr<ActivationOffloader>& offloader() const { return offloader_; }
  void set_offloader(std::shared_ptr<ActivationOffloader> offloader) { offloader_ = std::move(offloader); }

 private:
  std::shared_ptr<fp8::Fp8Engine> fp8_;
  ContextParallelContext cp_;
  MainGradsPtr main_grads_;
  std::shared_ptr<ActivationOffloader> offloader_;
};

}  // namespace fp8tron
