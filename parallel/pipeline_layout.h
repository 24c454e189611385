// Megatron's --pipeline-model-parallel-layout: a string of stages separated by '|', each a run of
// E (embedding), t (transformer layer), m (multi-token-prediction layer), L (loss: final norm,
// output layer, loss). Commas are cosmetic; "(X)*n" repeats X n times, then "c*n" repeats the
// character c. Stage i of the parsed list is virtual stage i / PP of pipeline rank i % PP.
// (PipelineParallelLayerLayout.parse_str_to_list and validate_layer_layout.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fp8tron {

// The stages of a layout string, each a string over "EtmL". Throws UserError naming a bad character.
std::vector<std::string> parse_pipeline_layout(const std::string& layout);

// Megatron's checks of a parsed layout against the model and the pipeline size. Throws UserError.
void validate_pipeline_layout(const std::vector<std::string>& stages, int64_t num_layers, int64_t mtp_layers, int pp);

}  // namespace fp8tron
