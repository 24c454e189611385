// What the trainer samples from: seq_length + 1 tokens per global sample index and split. The
// same index gives the same tokens whatever the parallel layout (Megatron's GPT dataset
// semantics). Implementations: the built-in and mock sources (builtin_datasets.h) and Megatron
// indexed datasets (file_source.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace fp8tron {

enum class Split { Train = 0, Valid = 1, Test = 2 };

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Writes seq_length + 1 tokens of sample `index` of `split` into out.
  virtual void sample(Split split, int64_t index, int64_t* out) const = 0;
  // Whether the split has data (a data path can leave the validation split empty).
  virtual bool has(Split) const { return true; }
  // The number of samples of the split, where it is finite (an indexed dataset's).
  virtual std::optional<int64_t> size(Split) const { return std::nullopt; }
  // Where token `position` of sample `index` comes from (dataset, document), for error
  // messages; "" when the source cannot say.
  virtual std::string token_origin(Split, int64_t /*index*/, int64_t /*position*/) const { return ""; }
};

}  // namespace fp8tron
