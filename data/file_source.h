// Megatron indexed datasets (--data-path / --train-data-path ..., --split) as a SampleSource:
// one blended GPT dataset per split, sized as Megatron sizes them.
#pragma once
#include <memory>

#include "data/sample_source.h"
#include "trainer/config.h"

namespace fp8tron {

std::unique_ptr<SampleSource> make_file_source(const Config& config);

}  // namespace fp8tron
