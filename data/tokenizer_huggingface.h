// HuggingFaceTokenizer for a local tokenizer.json (--tokenizer-model: the file or its directory)
// holding a byte-level BPE: model BPE with the ByteLevel pre-tokenizer (GPT-2, RoBERTa, GPT-NeoX,
// StarCoder style, or a Split with GPT-2's pattern followed by ByteLevel). Added tokens are cut
// out of the text first (leftmost, longest); a TemplateProcessing/Roberta/Bert post-processor adds
// its special tokens, as tokenizer(text).input_ids does. Anything else in the file (normalizers,
// other pre-tokenizer patterns, WordPiece/Unigram models) is refused with a UserError naming it,
// never silently tokenized differently.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "data/byte_level_bpe.h"
#include "data/tokenizer.h"

namespace fp8tron::data {

class HuggingFaceTokenizer : public Tokenizer {
 public:
  explicit HuggingFaceTokenizer(const std::string& path);

  std::vector<int64_t> tokenize(std::string_view text) const override;
  std::string detokenize(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eod() const override;
  std::string name() const override { return "HuggingFaceTokenizer"; }
  // Lookups as convert_tokens_to_ids: the vocabulary and the added tokens; the unknown token is
  // tokenizer_config.json's (or special_tokens_map.json's) unk_token, else the model's. Special:
  // the added tokens marked special, and the end-of-document token.
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  std::optional<int64_t> unknown_id() const override;
  bool is_special(int64_t id) const override;

 private:
  struct AddedToken {
    std::string content;
    int64_t id;
    bool lstrip, rstrip, single_word;
  };
  void load(const std::string& json_path);
  void encode_segment(std::string_view segment, std::vector<int64_t>& out) const;
  // The added token matched at text[pos], widened by lstrip/rstrip; nullptr when none.
  const AddedToken* match_added(std::string_view text, size_t pos, size_t* length) const;

  std::string path_;
  std::unique_ptr<ByteLevelBpe> bpe_;
  std::vector<AddedToken> added_;  // longest first
  std::unordered_map<int64_t, std::string> decoder_;
  bool add_prefix_space_ = false, use_regex_ = true;
  std::vector<int64_t> prefix_ids_, suffix_ids_;  // from the post-processor
  std::unordered_map<std::string, int64_t> token_ids_;  // vocabulary and added tokens
  std::unordered_set<int64_t> special_;                 // added tokens marked special
  int64_t vocab_size_ = 0, eod_ = -1, unknown_ = -1;
};

}  // namespace fp8tron::data
