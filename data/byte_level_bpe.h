// Byte-level BPE, the model inside GPT-2's tokenizer and HuggingFace ByteLevel BPE tokenizers.
//
// A piece of text (one pre-token) is taken as bytes; each byte starts as its own symbol, spelled
// with GPT-2's printable stand-in character for that byte (bytes_to_unicode: 'Ġ' for a space, ...).
// Then, round after round, the adjacent pair with the lowest merge rank is found and every
// occurrence of it is merged, left to right, until no adjacent pair has a rank. The symbols left
// are looked up in the vocabulary. This is exactly the reference algorithm (gpt2_tokenization.py's
// bpe()); a heap keeps it O(n log n) for long pieces, and results are cached per piece and thread
// because text repeats its words.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fp8tron::data {

// GPT-2's bytes_to_unicode(): the code point standing for byte b in vocab and merges strings.
uint32_t byte_to_unicode(uint8_t b);
// The inverse: the byte a code point stands for, or -1 when it stands for none.
int unicode_to_byte(uint32_t code_point);

class ByteLevelBpe {
 public:
  struct Options {
    int64_t unknown_id = 0;      // id of symbols missing from the vocabulary (GPT-2: 0)
    bool ignore_merges = false;  // HF: a piece that is itself in the vocabulary is one token
  };
  // vocab: token (as a UTF-8 string of stand-in characters) -> id. merges: pairs in rank order.
  ByteLevelBpe(const std::unordered_map<std::string, int64_t>& vocab,
               const std::vector<std::pair<std::string, std::string>>& merges, Options options);

  // Appends the ids of one piece of raw text bytes.
  void encode(std::string_view piece, std::vector<int64_t>& out) const;

  // The stand-in spelling of raw bytes (for vocabulary lookups of whole pieces).
  static std::string to_stand_ins(std::string_view bytes);

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // symbol id of the merged pair
  };
  int32_t intern(const std::string& symbol);
  void encode_uncached(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_symbols(std::vector<int32_t>& symbols) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  Options options_;
  uint64_t instance_;  // tells the per-thread caches of different tokenizers apart
  std::unordered_map<std::string, int32_t> symbol_ids_;
  std::vector<std::string> symbols_;
  std::vector<int64_t> symbol_vocab_id_;
  int32_t byte_symbol_[256];
  std::unordered_map<uint64_t, Merge> merges_;
  std::unordered_map<std::string, int64_t> whole_piece_vocab_;  // only with ignore_merges
};

}  // namespace fp8tron::data
