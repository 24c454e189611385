// GPT-2's pre-tokenizer: splits text into the pieces that BPE then encodes one by one. It is the
// regular expression
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (first matching alternative wins, each as long as it can be) written out by hand over code
// points: std::regex has no Unicode classes and is far too slow for preprocessing.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

namespace fp8tron::data {

struct Piece {
  uint32_t begin, length;  // byte range in the text
};

// Appends the pieces of `text` to `out` (cleared first). Text longer than 4 GiB is not supported.
void gpt2_pretokenize(std::string_view text, std::vector<Piece>& out);

}  // namespace fp8tron::data
