// SentencePiece tokenizers through libsentencepiece, as Megatron's legacy wrappers define them:
//   SentencePieceTokenizer     adds <CLS> <SEP> <EOD> <MASK> (and pad/bos/eos pieces) as special
//                              tokens, found in text before SentencePiece sees it; eod = <EOD>
//   GPTSentencePieceTokenizer  plain SentencePiece ids; eod = the model's eos id
//   Llama2Tokenizer            as GPTSentencePieceTokenizer, with bos prepended
// Without libsentencepiece at build time, constructing one throws a UserError.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace fp8tron::data {

bool sentencepiece_available();

class SentencePieceTokenizer : public Tokenizer {
 public:
  enum class Flavor { Megatron, GPT, Llama2 };
  SentencePieceTokenizer(const std::string& model_file, Flavor flavor);
  ~SentencePieceTokenizer() override;

  std::vector<int64_t> tokenize(std::string_view text) const override;
  std::string detokenize(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eod() const override { return eod_; }
  std::string name() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Flavor flavor_;
  int64_t vocab_size_ = 0, eod_ = -1, bos_ = -1;
  // Megatron flavor: special tokens in insertion order (ties in text position go to the first).
  std::vector<std::pair<std::string, int64_t>> special_;
};

}  // namespace fp8tron::data
