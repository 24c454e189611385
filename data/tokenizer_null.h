// Megatron's NullTokenizer: the "text" is already token ids separated by single spaces. Follows
// the legacy megatron/training tokenizer (_NullTokenizer): --vocab-size N gives ids 0..N-1 plus
// the end-of-document id N, so vocab_size() is N + 1.
#pragma once
#include "data/tokenizer.h"

namespace fp8tron::data {

class NullTokenizer : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t vocab_size);
  std::vector<int64_t> tokenize(std::string_view text) const override;
  std::string detokenize(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_ + 1; }
  int64_t eod() const override { return vocab_size_; }
  std::string name() const override { return "NullTokenizer"; }

 private:
  int64_t vocab_size_;
};

}  // namespace fp8tron::data
