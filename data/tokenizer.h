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
