// --fim-data: a GPT dataset whose samples are rewritten for fill-in-the-middle training
// (fim_transform.h), where Megatron's GPTFIMDataset rewrites them: in every dataset of a blend
// and every split, after the tokens are read and before inputs and labels are cut from them.
//
// Randomness: Megatron draws from one numpy.random.RandomState(--seed) per dataset, in the order
// its samples are read, so the same sample comes out differently with another data-parallel
// layout, number of data-loader workers or resume point. Here sample i draws from its own
// numpy.random.RandomState([--seed, i]): the same seed gives the same samples on every layout, on
// resume and in every run, with Megatron's draws and rewrite otherwise.
#pragma once
#include <memory>
#include <string>

#include "data/fim_transform.h"
#include "data/sample_dataset.h"
#include "data/tokenizer.h"

namespace fp8tron::data {

class FimDataset : public SampleDataset {
 public:
  FimDataset(std::shared_ptr<const SampleDataset> inner, std::shared_ptr<const Tokenizer> tokenizer,
             FimOptions options, uint32_t seed);

  int64_t size() const override { return inner_->size(); }
  int64_t sample_length() const override { return inner_->sample_length(); }
  // The inner sample rewritten; positions past the end of the data (kPadTokenId) stay as they are.
  void sample(int64_t index, int64_t* out) const override;
  std::string identity() const override;
  std::string token_origin(int64_t index, int64_t position) const override;

 private:
  std::shared_ptr<const SampleDataset> inner_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  FimOptions options_;
  uint32_t seed_;
};

}  // namespace fp8tron::data
