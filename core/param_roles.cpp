#include "core/param_roles.h"

namespace fp8tron {

bool is_embedding_or_output(const std::string& name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight" ||
         name == "output_layer_shared.weight";
}

bool is_mup_vector_like(const std::string& name, int64_t dim) {
  // Megatron's is_embedding_parameter: every parameter of the embedding module (word and
  // position tables, on the first stage or a later stage's copy), the output layer, and by name
  // anything else called an embedding.
  const bool embedding_class = name.find("embedding") != std::string::npos || is_embedding_or_output(name);
  return embedding_class || dim <= 1;
}

}  // namespace fp8tron
