// The run's arguments as one JSON object of typed values, as Megatron-LM hands vars(args) to
// wandb.init: the resolved flags of the start-up "arguments" block under the same names
// (hidden_size, lr, ...), with numbers, booleans, lists and null (None) for unset values, and the
// sizes Megatron derives from them (world_size, data_parallel_size, padded_vocab_size).
#pragma once
#include <nlohmann/json.hpp>

#include "core/config/config.h"

namespace fp8tron {

nlohmann::json arguments_json(const Config& config);

}  // namespace fp8tron
