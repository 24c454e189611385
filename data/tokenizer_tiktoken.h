// Megatron's TikTokenizer (megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py at
// Megatron-LM d98e8a6) with tiktoken's encoding rules, written out here:
//  - --tokenizer-model is a JSON list of {"rank", "token_bytes" (base64), "token_str"}, entry i of
//    rank i, the first 256 the single bytes; it is cut to its first (vocab - specials) entries.
//  - ids 0 .. S-1 (S = --tiktoken-num-special-tokens, default 1000) are the special tokens
//    (--tokenizer-special-tokens, default <unk> <s> </s> <mask> <pad> <cls> <sep>, then fillers
//    <SPECIAL_i>); BPE rank r is id r + S; the vocabulary is --vocab-size (default 2^17).
//  - encoding (Megatron's text_to_ids = tiktoken's encode(allowed_special="all")): special-token
//    strings in the text are their ids; the rest is split by the v1 or v2 pattern
//    (--tiktoken-pattern, default v2) and each piece is one id if it is a vocabulary entry, else
//    byte-level BPE: merge the adjacent pair whose concatenation has the lowest rank (the leftmost
//    on ties) until no adjacent pair is in the vocabulary. Nothing is added around the text.
//  - eod = the id of "</s>".
// The patterns need Unicode properties and possessive quantifiers: matched with PCRE2 (UTF + UCP);
// without libpcre2 at build time, constructing one throws a UserError.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace fp8tron::data {

bool tiktoken_available();

class TikTokenizer : public Tokenizer {
 public:
  explicit TikTokenizer(const TokenizerOptions& options);
  ~TikTokenizer() override;

  std::vector<int64_t> tokenize(std::string_view text) const override;
  std::string detokenize(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eod() const override { return eod_; }
  int64_t pad() const override { return pad_; }  // "<pad>"
  std::string name() const override { return "TikTokenizer"; }
  // Megatron's TikTokenizer looks tokens up among its special tokens (ids 0 .. S-1; another string
  // would need tiktoken's single-token encoding, which Megatron shifts twice: refused here) and
  // drops them all when decoding with remove_special_tokens.
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  bool is_special(int64_t id) const override { return id >= 0 && id < num_special_; }

  // Byte-level BPE of one piece (exposed for tests): ids of the merged parts.
  std::vector<int64_t> encode_piece(std::string_view piece) const;

 private:
  void encode_ordinary(std::string_view text, std::vector<int64_t>& out) const;
  int64_t rank_of(std::string_view bytes) const;  // -1 when not in the vocabulary

  struct Pattern;
  std::unique_ptr<Pattern> pattern_;
  int64_t vocab_size_ = 0, eod_ = -1, pad_ = -1, num_special_ = 0;
  std::vector<std::string> specials_;            // id -> text, ids 0 .. S-1
  std::unordered_map<std::string, int64_t> ranks_;  // token bytes -> id (rank + S)
  std::vector<std::string> id_bytes_;            // id - S -> token bytes
};

}  // namespace fp8tron::data
