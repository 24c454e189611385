// What the PyTorch reference (reference_gpt.py) needs to replay a run of fp8tron: the model's
// initial weights (global values, fp32, exactly as fp8tron starts), the training samples of every
// iteration (the built-in dataset, read through the same sample source the trainer reads), and
// fp8tron's own per-iteration losses.
//   fp8tron_golden_export OUT_DIR --config tests/trainer/golden/tiny_golden.json [more flags]
// writes OUT_DIR/{initial_weights.safetensors, samples.safetensors, fp8tron_losses.json}.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/loader/builtin_datasets.h"
#include "checkpoint/safetensors.h"
#include "trainer/cli/config_builder.h"
#include "trainer/cli/flags.h"
#include "trainer/trainer.h"

int main(int argc, char** argv) {
  using namespace fp8tron;
  try {
    if (argc < 2) throw UserError("usage: fp8tron_golden_export OUT_DIR --config FILE.json [flags]");
    const std::string out = argv[1];
    std::vector<const char*> args = {argv[0]};
    for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
    const ParsedCommandLine parsed = parse_command_line(int(args.size()), args.data());
    const Config c = build_config(parsed.values, LaunchEnv{}, /*gpu_available=*/false);
    if (c.data.source != DataSource::Builtin) throw UserError("the golden runs use --builtin-data");
    const TrainResult result = train(c, TrainOptions{.collect_initial_weights = true});

    std::vector<checkpoint::TensorToWrite> weights;
    std::vector<torch::Tensor> keep;
    for (const auto& [name, w] : result.initial_weights) {
      keep.push_back(w.to(torch::kFloat32).contiguous());
      weights.push_back({name, checkpoint::DType::F32, keep.back().sizes().vec(), keep.back().data_ptr(), {}});
    }
    checkpoint::write_safetensors(out + "/initial_weights.safetensors", weights);

    const int64_t n = c.training.train_iters * c.training.global_batch_size, len = c.model.seq_length + 1;
    auto samples = torch::empty({n, len}, torch::kInt64);
    const auto source = make_builtin_source(c.model.seq_length, c.model.vocab_size, c.training.seed);
    for (int64_t i = 0; i < n; ++i) source->sample(Split::Train, i, samples.data_ptr<int64_t>() + i * len);
    checkpoint::write_safetensors(out + "/samples.safetensors",
                                  {{"train", checkpoint::DType::I64, {n, len}, samples.data_ptr(), {}}});

    std::ofstream losses(out + "/fp8tron_losses.json");
    losses << "{\"losses\": [";
    for (size_t i = 0; i < result.losses.size(); ++i) {
      char text[64];
      std::snprintf(text, sizeof text, "%.17g", result.losses[i]);
      losses << (i ? ", " : "") << text;
    }
    losses << "]}\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8tron_golden_export: error: %s\n", e.what());
    return 1;
  }
}
