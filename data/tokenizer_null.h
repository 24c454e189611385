// Megatron's NullTokenizer as Megatron-LM d98e8a6 defines it (megatron/core/tokenizers, since
// Apr 2026): the "text" is already token ids separated by single spaces; --vocab-size N gives a
// vocabulary of N ids whose last one, N - 1, is the end-of-document id unless
// --null-tokenizer-eod-id names another. (The legacy tokenizer added an extra eod id N.)
#pragma once
#include <optional>

#include "data/tokenizer.h"

namespace fp8tron::data {

class NullTokenizer : public Tokenizer {
 public:
  NullTokenizer(int64_t vocab_size, std::optional<int64_t> eod_id = std::nullopt, int64_t pad_id = -1);
  std::vector<int64_t> tokenize(std::string_view text) const override;
  std::string detokenize(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eod() const override { return eod_; }
  int64_t pad() const override { return pad_; }
  std::string name() const override { return "NullTokenizer"; }

 private:
  int64_t vocab_size_, eod_, pad_;
};

}  // namespace fp8tron::data
