// The roles Megatron gives parameters by their names (fp8tron's names are Megatron's), which its
// optimizer parameter groups follow: the embedding and output layer (--decoupled-lr's group) and
// MuP's vector-like parameters. Torch-free so that the checkpoint readers can classify a saved
// model's parameters as the optimizer does (optim/param_groups.h).
#pragma once
#include <cstdint>
#include <string>

namespace fp8tron {

// Megatron's is_embedding_or_output_parameter: the word embedding (and a stage's copy of it) and
// the output layer.
bool is_embedding_or_output(const std::string& name);
// MuP: whether a parameter is vector-like (embedding class or at most 1-D).
bool is_mup_vector_like(const std::string& name, int64_t dim);

}  // namespace fp8tron
