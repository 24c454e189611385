#include "data/fim_tokens.h"

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::data {
namespace {

int64_t lookup(const Tokenizer& tokenizer, const std::string& flag, const std::string& token,
               std::vector<std::string>* warnings) {
  if (const auto id = tokenizer.token_to_id(token)) return *id;
  const auto unknown = tokenizer.unknown_id();
  if (!unknown)
    throw UserError(strprintf("--fim-data: %s \"%s\" is not a token of the %s; name one of its tokens with %s%s",
                              flag.c_str(), token.c_str(), tokenizer.name().c_str(), flag.c_str(),
                              tokenizer.name() == "TikTokenizer" ? " (TikTokenizer's FIM tokens must be among its "
                                                                   "--tokenizer-special-tokens)"
                                                                 : " (or add it to the tokenizer's vocabulary)"));
  if (warnings)
    warnings->push_back(strprintf("--fim-data: %s \"%s\" is not in the %s vocabulary, so it is the unknown token "
                                  "(id %lld), as in Megatron; name a token of the vocabulary with %s to give FIM its "
                                  "own markers",
                                  flag.c_str(), token.c_str(), tokenizer.name().c_str(), (long long)*unknown,
                                  flag.c_str()));
  return *unknown;
}

}  // namespace

bool tokenizer_supports_fim(const std::string& tokenizer_type) {
  return tokenizer_type == "GPT2BPETokenizer" || tokenizer_type == "HuggingFaceTokenizer" ||
         tokenizer_type == "TikTokenizer";
}

FimOptions fim_options(const FimConfig& config, const Tokenizer& tokenizer, std::vector<std::string>* warnings) {
  if (!tokenizer_supports_fim(tokenizer.name()))
    throw UserError("--fim-data needs a tokenizer that turns tokens back into text and looks its special tokens up: "
                    "GPT2BPETokenizer, HuggingFaceTokenizer or TikTokenizer (Megatron's FIM dataset fails with " +
                    tokenizer.name() + " too)");
  FimOptions o;
  o.rate = config.rate;
  o.spm_rate = config.spm_rate;
  o.fragment_rate = config.fragment_rate;
  o.no_prefix = config.no_prefix;
  o.tokens.prefix = lookup(tokenizer, "--fim-prefix-token", config.prefix_token, warnings);
  o.tokens.middle = lookup(tokenizer, "--fim-middle-token", config.middle_token, warnings);
  o.tokens.suffix = lookup(tokenizer, "--fim-suffix-token", config.suffix_token, warnings);
  o.tokens.pad = lookup(tokenizer, "--fim-pad-token", config.pad_token, warnings);
  o.tokens.eod = lookup(tokenizer, "--fim-eod-token", config.eod_token, warnings);
  if (config.split_sample) o.tokens.split_sample = lookup(tokenizer, "--fim-split-sample", *config.split_sample, warnings);
  return o;
}

}  // namespace fp8tron::data
