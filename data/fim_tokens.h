// The special tokens of --fim-data, found as Megatron finds them: each --fim-*-token string (and
// --fim-split-sample) is looked up as one vocabulary entry (convert_tokens_to_ids), not tokenized.
// A string missing from the vocabulary becomes the tokenizer's unknown token where it has one
// (GPT-2's "<|endoftext|>": Megatron's GPT-2 runs with the default names get that id for every FIM
// token), said in a warning; without one it is an error naming the flag.
#pragma once
#include <string>
#include <vector>

#include "core/config/data_config.h"
#include "data/fim_transform.h"
#include "data/tokenizer.h"

namespace fp8tron::data {

// The tokenizer types Megatron's FIM dataset works with: they detokenize without special tokens
// and look tokens up (its SentencePiece and Null tokenizers fail there).
bool tokenizer_supports_fim(const std::string& tokenizer_type);

// The rewrite's options for this tokenizer; `warnings` gets one line per token that fell back to
// the unknown token. Throws a UserError for a token the tokenizer does not have.
FimOptions fim_options(const FimConfig& config, const Tokenizer& tokenizer, std::vector<std::string>* warnings);

}  // namespace fp8tron::data
