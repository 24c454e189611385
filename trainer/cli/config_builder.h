// Flags (+ JSON config) + launcher environment -> the validated Config. Everything that can be
// wrong with a configuration is reported here, before any allocation, as one UserError line
// naming the flags.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "parallel/layer_split.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

// The tokenizer's vocabulary size (before padding) and end-of-document id. The trainer builds
// the tokenizer (data/) to answer, and checks --fim-data's tokens against it; torch-free callers
// without real data pass none.
struct TokenizerInfo {
  int64_t vocab_size = 0;
  int64_t eod = -1;
  int64_t pad = -1;  // Megatron's GPT dataset masks labels equal to the tokenizer's pad id (-1: none)
  std::vector<std::string> warnings;  // e.g. --fim-data's tokens that fell back to the unknown token
};
using TokenizerResolver = std::function<TokenizerInfo(const DataConfig&)>;

// `gpu_available` decides the default --device.
Config build_config(const FlagValues& flags, const LaunchEnv& launch, bool gpu_available,
                    const TokenizerResolver& tokenizer = {});

// Megatron's vocabulary padding: up to a multiple of make_vocab_size_divisible_by * tp.
int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tp);

// How the model is spread over the pipeline stages (parallel/layer_split.h) for this config.
PipelineSplit pipeline_split(const Config& config);

// Named validation rules over the built config (trainer/cli/validation.cpp).
void validate_config(const Config& config, const FlagValues& flags);

// One warning per group of given flags that do nothing in this combination (e.g.
// --sequence-parallel without tensor parallelism, FP8 settings without --fp8-format;
// trainer/cli/inert_flags.cpp). build_config appends them to Config::hint_warnings.
std::vector<std::string> inert_flag_warnings(const Config& config, const FlagValues& flags);

// Throws the UserError a run with this config gets when it uses a flag whose feature has not
// landed ("not supported yet: --flag (feature)"). Training calls it before anything is built, and
// --dry-run after printing the plan, so a dry run fails exactly when the real run would.
void require_supported(const Config& config);

}  // namespace fp8tron
