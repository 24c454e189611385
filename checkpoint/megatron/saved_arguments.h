// The arguments Megatron-LM stored in its checkpoint (the pickled argparse namespace `args` of the
// torch_dist common state, or of a legacy rank file), as text, for --use-checkpoint-args.
// Torch-free header.
#pragma once
#include <map>
#include <optional>
#include <string>

namespace fp8tron::checkpoint::megatron {

// Megatron's argument names (args.num_layers -> "num_layers") and values as Python prints them
// ("24", "0.02", "1e-05", "true"/"false", "LayerNorm", "None"); lists and other objects are left
// out. std::nullopt when `dir` (an iter_NNNNNNN directory) is not a Megatron checkpoint; a
// UserError naming the file when it is one that cannot be read.
std::optional<std::map<std::string, std::string>> saved_arguments(const std::string& dir);

}  // namespace fp8tron::checkpoint::megatron
