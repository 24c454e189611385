// GPU test of fine-grained activation offloading (ctest label `gpu`): skipped without a CUDA
// device; a difference is a failure, never a skip. The copies run on their own streams, ordered by
// events against the compute stream (models/recompute/activation_offload.h): a tensor read before
// its copy back finished, or a released block reused before its copy out read it, changes the
// values, so the runs must be bitwise the runs without offloading.
#include <gtest/gtest.h>

#include "tests/models/small_gpu_run.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

TEST(ActivationOffloadGpu, DenseMoeAndMlaTrainBitwiseAsWithoutOffloading) {
  REQUIRE_GPU();
  const std::vector<std::string> moe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "128",
                                        "--moe-layer-freq", "([0]+[1]*3)", "--moe-aux-loss-coeff", "1e-2",
                                        "--disable-bias-linear", "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall"};
  const std::vector<std::string> mla = {"--multi-latent-attention", "--q-lora-rank", "64", "--kv-lora-rank", "64",
                                        "--qk-head-dim", "32", "--qk-pos-emb-head-dim", "32", "--v-head-dim", "32",
                                        "--position-embedding-type", "rope", "--disable-bias-linear"};
  const std::vector<std::string> offload = {"--fine-grained-activation-offloading", "--min-offloaded-tensor-size", "0",
                                            "--offload-modules", "attn_norm", "qkv_linear", "core_attn", "attn_proj",
                                            "mlp_norm", "expert_fc1", "moe_act"};
  const std::vector<std::string> recompute = {"--recompute-granularity", "selective", "--recompute-modules", "core_attn",
                                              "moe_act"};
  const std::vector<std::string> tensorwise = {"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"};
  for (const auto& model : {std::vector<std::string>{}, moe, with(moe, mla), with(moe, tensorwise), with(moe, recompute)}) {
    std::string what;
    for (const auto& a : model) what += a + " ";
    const TrainResult plain = train_small_gpu_run(model);
    const TrainResult r = train_small_gpu_run(with(model, offload));
    EXPECT_FALSE(r.activation_offload_bytes.empty()) << what;
    ASSERT_EQ(r.losses.size(), plain.losses.size()) << what;
    for (size_t i = 0; i < r.losses.size(); ++i) EXPECT_EQ(r.losses[i], plain.losses[i]) << what << " iteration " << i + 1;
    for (const auto& [name, w] : plain.final_weights) EXPECT_TRUE(torch::equal(w, r.final_weights.at(name))) << what << ": " << name;
  }
}

}  // namespace
}  // namespace fp8tron
