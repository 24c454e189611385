#include "data/tokenizer.h"

#include "core/error.h"
#include "core/text.h"
#include "data/tokenizer_gpt2.h"
#include "data/tokenizer_huggingface.h"
#include "data/tokenizer_null.h"
#include "data/tokenizer_sentencepiece.h"

namespace fp8tron::data {

std::vector<std::string> tokenizer_types() {
  return {"GPT2BPETokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
          "Llama2Tokenizer", "NullTokenizer"};
}

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& o) {
  using Flavor = SentencePieceTokenizer::Flavor;
  if (o.type == "GPT2BPETokenizer") return std::make_unique<GPT2BPETokenizer>(o.vocab_file, o.merge_file);
  if (o.type == "HuggingFaceTokenizer") return std::make_unique<HuggingFaceTokenizer>(o.tokenizer_model);
  if (o.type == "SentencePieceTokenizer") return std::make_unique<SentencePieceTokenizer>(o.tokenizer_model, Flavor::Megatron);
  if (o.type == "GPTSentencePieceTokenizer") return std::make_unique<SentencePieceTokenizer>(o.tokenizer_model, Flavor::GPT);
  if (o.type == "Llama2Tokenizer") return std::make_unique<SentencePieceTokenizer>(o.tokenizer_model, Flavor::Llama2);
  if (o.type == "NullTokenizer") {
    if (!o.vocab_size) throw UserError("NullTokenizer needs --vocab-size");
    return std::make_unique<NullTokenizer>(*o.vocab_size);
  }
  const std::string hint = closest_match(o.type, tokenizer_types());
  throw UserError(strprintf("--tokenizer-type %s is not supported%s (choose from %s)", o.type.c_str(),
                            hint.empty() ? "" : (", did you mean " + hint + "?").c_str(),
                            join(tokenizer_types(), ", ").c_str()));
}

}  // namespace fp8tron::data
