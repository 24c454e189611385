// Megatron's GPT2BPETokenizer (megatron/training/tokenizer/gpt2_tokenization.py): vocab.json +
// merges.txt, GPT-2 pre-tokenization, byte-level BPE. Reproduces the reference's quirks:
// merges.txt's first line (the "#version" header) and the text after its last newline are
// skipped; a symbol missing from the vocabulary becomes id 0; "<|endoftext|>" inside text is
// plain text, not the special token.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/byte_level_bpe.h"
#include "data/tokenizer.h"

namespace fp8tron::data {

class GPT2BPETokenizer : public Tokenizer {
 public:
  GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file);

  std::vector<int64_t> tokenize(std::string_view text) const override;
  std::string detokenize(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return int64_t(vocab_.size()); }
  int64_t eod() const override { return eod_; }
  std::string name() const override { return "GPT2BPETokenizer"; }
  // As Megatron's GPT2BPETokenizer (Hugging Face's GPT-2 tokenizer over these files) looks tokens
  // up: vocab.json's entries; a missing token is "<|endoftext|>" (eod()), the only special token.
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  std::optional<int64_t> unknown_id() const override { return eod_; }
  bool is_special(int64_t id) const override { return id == eod_; }

 private:
  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<int64_t, std::string> decoder_;
  std::unique_ptr<ByteLevelBpe> bpe_;
  int64_t eod_ = 0;
};

// Shared by the byte-level tokenizers.
std::unordered_map<std::string, int64_t> load_vocab_json(const std::string& path);
std::vector<std::pair<std::string, std::string>> load_merges_txt(const std::string& path);
// Concatenates the tokens' stand-in strings, maps them back to bytes and decodes the bytes as
// UTF-8 with replacement (the reference decode()).
std::string decode_byte_level(const std::unordered_map<int64_t, std::string>& decoder, const std::vector<int64_t>& ids);

}  // namespace fp8tron::data
