// Tokenizers, selected as Megatron selects them (--tokenizer-type and its files). All are
// torch-free and thread-safe: tokenize() may run on many threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/data_config.h"

namespace fp8tron::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int64_t> tokenize(std::string_view text) const = 0;
  virtual std::string detokenize(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;  // before Megatron's padding to a multiple
  virtual int64_t eod() const = 0;         // end-of-document id (--append-eod, --eod-mask-loss)
  // The pad id (-1: none): Megatron's GPT dataset masks labels equal to it out of the loss.
  virtual int64_t pad() const { return -1; }
  virtual std::string name() const = 0;    // the --tokenizer-type value

  // What --fim-data needs besides tokenize/detokenize (data/fim_tokens.h), as Megatron's library
  // tokenizers provide it. The id of the vocabulary entry spelled `token` (convert_tokens_to_ids
  // without a fallback); nullopt when there is none or the tokenizer cannot look tokens up.
  virtual std::optional<int64_t> token_to_id(std::string_view /*token*/) const { return std::nullopt; }
  // The id convert_tokens_to_ids gives a token missing from the vocabulary (the unknown token);
  // nullopt when the tokenizer has none and a missing token is an error.
  virtual std::optional<int64_t> unknown_id() const { return std::nullopt; }
  // Whether ids_to_text(..., remove_special_tokens=True) drops this id.
  virtual bool is_special(int64_t /*id*/) const { return false; }
};

struct TokenizerOptions {
  std::string type;             // --tokenizer-type
  std::string vocab_file;       // --vocab-file
  std::string merge_file;       // --merge-file
  std::string tokenizer_model;  // --tokenizer-model
  std::optional<int64_t> vocab_size;  // --vocab-size (NullTokenizer, TikTokenizer)
  std::optional<int64_t> null_eod_id;  // --null-tokenizer-eod-id (default vocab size - 1)
  int64_t null_pad_id = -1;            // --null-tokenizer-pad-id
  std::string tiktoken_pattern = "v2";     // --tiktoken-pattern
  int64_t tiktoken_num_special_tokens = 1000;  // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;     // --tokenizer-special-tokens (TikTokenizer)
};

// The tokenizer flags of a run's data configuration.
TokenizerOptions tokenizer_options(const DataConfig& data);

// The tokenizer types this build supports, for help and error messages.
std::vector<std::string> tokenizer_types();

// Builds the tokenizer, or throws a UserError naming the missing flag or the bad file.
std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& options);

}  // namespace fp8tron::data
