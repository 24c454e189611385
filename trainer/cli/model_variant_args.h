// Flags of the model variants (core/config/model_variants.h): rotary-embedding variants,
// squared ReLU, multi-latent attention, multi-token prediction. Only the flag-to-struct mapping
// and Megatron's own refusals live here; cross-flag rules are in validation.cpp.
#pragma once
#include <string>

#include "core/config/model_config.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

// --position-embedding-type (mrope and relative are refused by name).
PositionEmbedding parse_position_embedding(const std::string& value);
void build_model_variants(const FlagValues& f, ModelConfig& m);

}  // namespace fp8tron
