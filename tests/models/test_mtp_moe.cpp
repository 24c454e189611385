// Multi-token prediction in an MoE model, as Megatron builds it (gpt_builders.py): the MTP layer's
// inner transformer layer takes the spec of the decoder's last layer (an MoE layer when
// --moe-layer-freq makes that one an MoE layer), or the default (MoE) layer spec in a pipeline
// chunk without decoder layers; its router records its metrics as layer num_layers + depth and
// its auxiliary losses reach the gradients as the decoder's do (not scaled by
// --mtp-loss-scaling-factor); the logged losses are averaged over the MoE layers counting the MTP
// layers when the last decoder layer is an MoE layer. Training end to end, FP8 emulated.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <dirent.h>

#include <cmath>
#include <set>

#include "models/gpt_model.h"
#include "models/moe/router.h"
#include "tests/test_helpers.h"
#include "checkpoint/file_io.h"
#include "trainer/cli/model_math.h"
#include "trainer/logging/tensorboard_writer.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;

std::vector<std::string> mtp_moe_args(const std::string& pattern, std::initializer_list<std::string> extra = {}) {
  auto a = tiny_args({"--attention-dropout", "0", "--hidden-dropout", "0", "--num-experts", "4", "--moe-ffn-hidden-size",
                      "32", "--moe-layer-freq", pattern, "--mtp-num-layers", "1", "--position-embedding-type", "rope"});
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::set<std::string> names_of(const torch::nn::Module& model) {
  std::set<std::string> names;
  for (const auto& p : model.named_parameters()) names.insert(p.key());
  return names;
}

int64_t numel_of(const torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

TEST(MtpMoe, TheMtpLayerFollowsTheDecodersLastLayer) {
  // The last decoder layer is an MoE layer: so is the MTP layer's, under Megatron's names.
  const ModelConfig moe = build(mtp_moe_args("([0]+[1])", {"--moe-router-enable-expert-bias", "--moe-router-score-function",
                                                           "sigmoid", "--moe-shared-expert-intermediate-size", "16",
                                                           "--disable-bias-linear"}))
                              .model;
  GptModel a(moe);
  auto names = names_of(*a);
  for (const char* n : {"mtp.layers.0.enorm.weight", "mtp.layers.0.eh_proj.weight", "mtp.layers.0.final_layernorm.weight",
                        "mtp.layers.0.transformer_layer.pre_mlp_layernorm.weight",
                        "mtp.layers.0.transformer_layer.mlp.router.weight",
                        "mtp.layers.0.transformer_layer.mlp.experts.linear_fc1.weight0",
                        "mtp.layers.0.transformer_layer.mlp.experts.linear_fc2.weight3",
                        "mtp.layers.0.transformer_layer.mlp.shared_experts.linear_fc1.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_FALSE(names.count("mtp.layers.0.transformer_layer.mlp.linear_fc1.weight"));
  std::set<std::string> buffers;
  for (const auto& b : a->named_buffers()) buffers.insert(b.key());
  EXPECT_TRUE(buffers.count("mtp.layers.0.transformer_layer.mlp.router.expert_bias"));
  EXPECT_TRUE(a->param_infos().at("mtp.layers.0.transformer_layer.mlp.experts.linear_fc1.weight0").expert);
  EXPECT_EQ(count_parameters(moe).total, numel_of(*a));

  // A dense last decoder layer: a dense MTP layer (the norm fused into linear_fc1, no router).
  const ModelConfig dense_last = build(mtp_moe_args("([1]+[0])")).model;
  GptModel b(dense_last);
  names = names_of(*b);
  EXPECT_TRUE(names.count("mtp.layers.0.transformer_layer.mlp.linear_fc1.layer_norm_weight"));
  EXPECT_FALSE(names.count("mtp.layers.0.transformer_layer.mlp.router.weight"));
  EXPECT_TRUE(names.count("decoder.layers.0.mlp.router.weight"));
  EXPECT_EQ(count_parameters(dense_last).total, numel_of(*b));
}

TEST(MtpMoe, AChunkWithoutDecoderLayersBuildsAnMoeMtpLayer) {
  // Megatron falls back to the default layer spec (an MoE layer in an MoE model) when the chunk
  // holding the MTP layers has no decoder layer, whatever the pattern's last entry.
  const ModelConfig m = build(mtp_moe_args("([1]+[0])")).model;
  EXPECT_FALSE(mtp_layers_are_moe(m, /*chunk_has_decoder_layers=*/true));
  EXPECT_TRUE(mtp_layers_are_moe(m, /*chunk_has_decoder_layers=*/false));
  auto context = std::make_shared<MoeContext>(m.moe, moe_metric_layers(m), ExpertParallelGroups::single_process());
  TensorParallelContext tp{make_self_communicator("tp", 0), 0, 1, false};
  GptModel head(m, tp, StageSpec{2, 0, false, true}, nullptr, context);
  const auto names = names_of(*head);
  EXPECT_TRUE(names.count("mtp.layers.0.transformer_layer.mlp.router.weight"));
  EXPECT_FALSE(names.count("decoder.final_layernorm.weight"));  // on the chunk with the last layer
  // The configuration says so for a layout putting the MTP layers in a chunk of their own.
  const Config c = build(mtp_moe_args("([1]+[0])", {"--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                                                    "Ett|mL", "--global-batch-size", "4"}),
                         2);
  EXPECT_TRUE(c.model.mtp.chunk_without_decoder_layers);
  EXPECT_FALSE(build(mtp_moe_args("([1]+[0])", {"--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                                                "Et|tmL", "--global-batch-size", "4"}),
                     2)
                   .model.mtp.chunk_without_decoder_layers);
  // Megatron's logging counts the MTP layers only by the pattern's last entry (training.py).
  EXPECT_EQ(logged_moe_layers(m), 1);
  EXPECT_EQ(logged_moe_layers(build(mtp_moe_args("([0]+[1])")).model), 2);
  EXPECT_EQ(logged_moe_layers(build(mtp_moe_args("([0]+[1])", {"--mtp-num-layers", "2"})).model), 3);
}

// The gradient of the MTP layer's router weight, with the given load-balancing coefficient and
// MTP loss scale, after one training forward/backward of the loss stage.
torch::Tensor mtp_router_grad(const std::string& coeff, const std::string& mtp_scale) {
  const ModelConfig m = build(mtp_moe_args("([0]+[1])", {"--moe-aux-loss-coeff", coeff, "--mtp-loss-scaling-factor", mtp_scale,
                                                         "--moe-router-load-balancing-type", "seq_aux_loss"}))
                            .model;
  GptModel model(m);
  model->train();
  torch::manual_seed(3);
  auto tokens = torch::randint(0, m.vocab_size, {2, m.seq_length});
  auto labels = torch::randint(0, m.vocab_size, {2, m.seq_length});
  auto mask = torch::ones({2, m.seq_length});
  model->forward_stage(tokens, labels, mask).backward();
  if (coeff != "0") {
    // Recorded after the decoder's two layers: index 2 (layer 0 is dense, never recorded).
    const auto values = model->moe_context()->metrics().at("seq_load_balancing_loss").values;
    EXPECT_EQ(values.numel(), 3);
    EXPECT_EQ(values[0].item<double>(), 0.0);
    EXPECT_GT(values[1].item<double>(), 0.0);
    EXPECT_GT(values[2].item<double>(), 0.0);
  }
  return model->named_parameters()["mtp.layers.0.transformer_layer.mlp.router.weight"].grad().clone();
}

TEST(MtpMoe, TheMtpLayersAuxLossReachesTheGradientUnscaledByTheMtpFactor) {
  const auto base = mtp_router_grad("0", "0.1"), aux = mtp_router_grad("1e-1", "0.1"), aux2 = mtp_router_grad("2e-1", "0.1");
  const auto part = aux - base;
  EXPECT_GT(part.abs().max().item<double>(), 1e-6);                     // the aux loss moves the router
  EXPECT_TRUE(torch::allclose(aux2 - base, 2 * part, 1e-4, 1e-7));      // linearly in its coefficient
  // A different MTP loss scale changes the MTP loss's part, not the aux loss's (Megatron attaches
  // it with MoEAuxLossAutoScaler, outside the MTP loss).
  const auto base5 = mtp_router_grad("0", "0.5"), aux5 = mtp_router_grad("1e-1", "0.5");
  EXPECT_FALSE(torch::allclose(base5, base, 1e-4, 1e-7));
  EXPECT_TRUE(torch::allclose(aux5 - base5, part, 1e-4, 1e-7));
}

Config train_config(const std::string& pattern, std::initializer_list<std::string> extra) {
  auto args = mtp_moe_args(pattern, {"--global-batch-size", "4", "--train-iters", "12", "--lr", "3e-3", "--log-interval",
                                     "100", "--eval-iters", "0", "--device", "cpu", "--moe-aux-loss-coeff", "1e-2"});
  args.insert(args.end(), extra.begin(), extra.end());
  return build(args);
}

std::map<std::string, std::vector<double>> tensorboard_scalars(const std::string& dir) {
  std::string file;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("events.out.tfevents", 0) == 0) file = dir + "/" + e->d_name;
    closedir(d);
  }
  std::map<std::string, std::vector<double>> by_tag;
  for (const auto& ev : read_tensorboard_scalars(file)) by_tag[ev.tag].push_back(ev.value);
  return by_tag;
}

TEST(MtpMoe, TrainsAndLogsTheMtpLayersAuxLossAsMegatron) {
  const std::string dir = temp_file("mtp_moe_tb", "");
  std::remove(dir.c_str());
  const TrainResult r = train(train_config("([0]+[1])", {"--moe-per-layer-logging", "--tensorboard-dir", dir,
                                                         "--moe-router-enable-expert-bias", "--moe-router-score-function",
                                                         "sigmoid"}));
  ASSERT_EQ(r.losses.size(), 12u);
  EXPECT_LT(r.losses.back(), r.losses.front());
  auto tb = tensorboard_scalars(dir);
  ASSERT_EQ(tb["moe/load_balancing_loss_layer_2"].size(), 12u);  // the MTP layer, after the decoder's
  for (size_t i = 0; i < 12; ++i) {
    // Averaged over the decoder's MoE layer and the MTP layer.
    const double mean = (tb["moe/load_balancing_loss_layer_1"][i] + tb["moe/load_balancing_loss_layer_2"][i]) / 2;
    EXPECT_NEAR(r.moe_losses.at("load_balancing_loss")[i], mean, 1e-6);
    EXPECT_GT(tb["moe/load_balancing_loss_layer_2"][i], 0.5);
  }
  checkpoint::remove_tree(dir);
}

TEST(MtpMoe, Fp8TrainsEmulatedOnTheCpu) {
  for (auto extra : {std::initializer_list<std::string>{"--fp8-format", "hybrid"},
                     {"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--moe-token-dispatcher-type", "alltoall"}}) {
    const TrainResult r = train(train_config("([0]+[1])", extra));
    for (double l : r.losses) ASSERT_TRUE(std::isfinite(l));
    EXPECT_LT(r.losses.back(), r.losses.front());
  }
}

}  // namespace
}  // namespace fp8tron
