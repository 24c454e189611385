#include "data/tokenizer.h"

#include "core/error.h"
#include "core/text.h"
#include "data/tokenizer_gpt2.h"
#include "data/tokenizer_huggingface.h"
#include "data/tokenizer_null.h"
#include "data/tokenizer_sentencepiece.h"
#include "data/tokenizer_tiktoken.h"

namespace fp8tron::data {

TokenizerOptions tokenizer_options(const DataConfig& d) {
  TokenizerOptions o;
  o.type = d.tokenizer_type;
  o.vocab_file = d.vocab_file;
  o.merge_file = d.merge_file;
  o.tokenizer_model = d.tokenizer_model;
  o.vocab_size = d.null_vocab_size;
  o.null_eod_id = d.null_eod_id;
  o.null_pad_id = d.pad;
  if (!d.tiktoken_pattern.empty()) o.tiktoken_pattern = d.tiktoken_pattern;
  o.tiktoken_num_special_tokens = d.tiktoken_num_special_tokens;
  o.special_tokens = d.special_tokens;
  return o;
}

std::vector<std::string> tokenizer_types() {
  return {"GPT2BPETokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
          "Llama2Tokenizer", "TikTokenizer", "NullTokenizer"};
}

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& o) {
  using Flavor = SentencePieceTokenizer::Flavor;
  if (o.type == "GPT2BPETokenizer") return std::make_unique<GPT2BPETokenizer>(o.vocab_file, o.merge_file);
  if (o.type == "HuggingFaceTokenizer") return std::make_unique<HuggingFaceTokenizer>(o.tokenizer_model);
  if (o.type == "SentencePieceTokenizer") return std::make_unique<SentencePieceTokenizer>(o.tokenizer_model, Flavor::SentencePiece);
  if (o.type == "GPTSentencePieceTokenizer") return std::make_unique<SentencePieceTokenizer>(o.tokenizer_model, Flavor::GPT);
  if (o.type == "Llama2Tokenizer") return std::make_unique<SentencePieceTokenizer>(o.tokenizer_model, Flavor::Llama2);
  if (o.type == "TikTokenizer") return std::make_unique<TikTokenizer>(o);
  if (o.type == "NullTokenizer") {
    if (!o.vocab_size) throw UserError("NullTokenizer needs --vocab-size");
    return std::make_unique<NullTokenizer>(*o.vocab_size, o.null_eod_id, o.null_pad_id);
  }
  const std::string hint = closest_match(o.type, tokenizer_types());
  throw UserError(strprintf("--tokenizer-type %s is not supported%s (choose from %s)", o.type.c_str(),
                            hint.empty() ? "" : (", did you mean " + hint + "?").c_str(),
                            join(tokenizer_types(), ", ").c_str()));
}

}  // namespace fp8tron::data
