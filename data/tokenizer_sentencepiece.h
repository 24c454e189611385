// SentencePiece tokenizers through libsentencepiece, as Megatron-LM d98e8a6 defines them
// (megatron/core/tokenizers/text/libraries/sentencepiece_tokenizer.py): SentencePieceTokenizer,
// GPTSentencePieceTokenizer and Llama2Tokenizer are all the model's own pieces and ids
// (encode_as_ids), nothing added: no BOS, no extra special tokens; eod = the model's eos id,
// vocabulary = the model's piece count. Megatron's legacy wrappers (removed Feb 2026) differed:
// Llama2Tokenizer prepended BOS and SentencePieceTokenizer appended <CLS> <SEP> <EOD> <MASK> to the
// vocabulary; data preprocessed with them keeps its ids, and trains the same.
// Without libsentencepiece at build time, constructing one throws a UserError.
#pragma once
#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace fp8tron::data {

bool sentencepiece_available();

class SentencePieceTokenizer : public Tokenizer {
 public:
  enum class Flavor { SentencePiece, GPT, Llama2 };  // the --tokenizer-type name only
  SentencePieceTokenizer(const std::string& model_file, Flavor flavor);
  ~SentencePieceTokenizer() override;

  std::vector<int64_t> tokenize(std::string_view text) const override;
  std::string detokenize(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eod() const override { return eod_; }
  int64_t pad() const override { return pad_; }  // the model's pad id (-1 when it has none)
  std::string name() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Flavor flavor_;
  int64_t vocab_size_ = 0, eod_ = -1, pad_ = -1;
};

}  // namespace fp8tron::data
