// What the trainer reads: a finite list of token samples addressed by a global sample index. The
// same index always gives the same tokens, whatever the data-parallel layout.
#pragma once
#include <cstdint>
#include <string>

namespace fp8tron::data {

// Token id written into the positions of a sample that run past the end of the data (only the
// last validation sample can, and only with drop_last_partial_validation_sequence off):
// Megatron's _PAD_TOKEN_ID. The trainer masks these positions out of the loss.
constexpr int64_t kPadTokenId = -1;

class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual int64_t size() const = 0;
  // Number of tokens sample() writes: seq_length + 1 (inputs and the shifted labels).
  virtual int64_t sample_length() const = 0;
  // Writes sample `index` (0 <= index < size()) into out[0 .. sample_length()).
  virtual void sample(int64_t index, int64_t* out) const = 0;
  // Text that changes whenever the samples would; a dataset built on top of this one (a blend)
  // puts it into its own cache key.
  virtual std::string identity() const = 0;
  // Where token `position` of sample `index` comes from, for error messages (e.g. "dataset
  // /data/web_text_document, document 1234 (token 17 of it)"); "" when the dataset cannot say.
  virtual std::string token_origin(int64_t /*index*/, int64_t /*position*/) const { return ""; }
};

}  // namespace fp8tron::data
