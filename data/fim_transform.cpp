#include "data/fim_transform.h"

#include <algorithm>

#include "core/error.h"

namespace fp8tron::data {
namespace {

using Tokens = std::vector<int64_t>;

// Byte offsets of the code points of valid UTF-8 text, and the text's size at the end.
std::vector<size_t> code_point_offsets(const std::string& text) {
  std::vector<size_t> offsets;
  for (size_t i = 0; i < text.size(); ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) offsets.push_back(i);
  offsets.push_back(text.size());
  return offsets;
}

void append(Tokens& out, const Tokens& part) { out.insert(out.end(), part.begin(), part.end()); }

class Rewriter {
 public:
  Rewriter(const FimOptions& options, const Tokenizer& tokenizer, NumpyRandomState& rng)
      : o_(options), t_(tokenizer), rng_(rng) {}

  // Step 3: one piece, rewritten with probability `rate` (Megatron's _permute without truncation).
  Tokens permute(const Tokens& piece, double rate) {
    if (!rng_.binomial_one(rate)) return piece;
    const std::string text = text_of(piece);
    if (o_.no_prefix && text.starts_with(*o_.no_prefix)) return piece;
    const std::vector<size_t> at = code_point_offsets(text);
    const uint64_t characters = at.size() - 1;
    uint64_t first = rng_.random_interval(characters), second = rng_.random_interval(characters);
    if (first > second) std::swap(first, second);
    const Tokens prefix = t_.tokenize(std::string_view(text).substr(0, at[first]));
    const Tokens middle = t_.tokenize(std::string_view(text).substr(at[first], at[second] - at[first]));
    const Tokens suffix = t_.tokenize(std::string_view(text).substr(at[second]));
    const FimTokenIds& id = o_.tokens;
    Tokens out;
    out.reserve(prefix.size() + middle.size() + suffix.size() + 3);
    if (rng_.binomial_one(o_.spm_rate)) {
      out = {id.prefix, id.suffix};
      append(out, suffix);
      out.push_back(id.middle);
      append(out, prefix);
      append(out, middle);
    } else {
      out = {id.prefix};
      append(out, prefix);
      out.push_back(id.suffix);
      append(out, suffix);
      out.push_back(id.middle);
      append(out, middle);
    }
    return out;
  }

  // Step 2: a segment between end-of-document tokens (_fim_split_and_permute_sequence).
  Tokens split_and_permute(const Tokens& segment) {
    const auto& split = o_.tokens.split_sample;
    if (!split || std::find(segment.begin(), segment.end(), *split) == segment.end()) return permute(segment, o_.rate);
    if (!rng_.binomial_one(o_.rate)) return segment;
    FP8TRON_CHECK(o_.fragment_rate.has_value(), "--fim-split-sample without --fim-fragment-rate");
    return around(segment, *split, [this](const Tokens& fragment) { return permute(fragment, *o_.fragment_rate); });
  }

  // Step 1: the whole sample, cut at the end-of-document token.
  Tokens sample(const Tokens& tokens) {
    return around(tokens, o_.tokens.eod, [this](const Tokens& segment) { return split_and_permute(segment); });
  }

 private:
  // The pieces between `separator` tokens rewritten by `rewrite`, the separators kept; an empty
  // piece before a separator is dropped, the piece after the last one is always rewritten.
  template <class Rewrite>
  Tokens around(const Tokens& tokens, int64_t separator, Rewrite rewrite) {
    Tokens out;
    auto start = tokens.begin();
    for (auto it = tokens.begin(); it != tokens.end(); ++it) {
      if (*it != separator) continue;
      if (it != start) {
        append(out, rewrite(Tokens(start, it)));
        out.push_back(separator);
      }
      start = it + 1;
    }
    append(out, rewrite(Tokens(start, tokens.end())));
    return out;
  }

  // ids_to_text(ids, remove_special_tokens=True): special tokens and ids outside the vocabulary
  // (which have no token) are left out.
  std::string text_of(const Tokens& piece) const {
    Tokens kept;
    kept.reserve(piece.size());
    for (int64_t id : piece)
      if (id >= 0 && id < t_.vocab_size() && !t_.is_special(id)) kept.push_back(id);
    return t_.detokenize(kept);
  }

  const FimOptions& o_;
  const Tokenizer& t_;
  NumpyRandomState& rng_;
};

}  // namespace

std::vector<int64_t> fill_in_the_middle(std::span<const int64_t> sample, const FimOptions& options,
                                        const Tokenizer& tokenizer, NumpyRandomState& rng) {
  Rewriter rewriter(options, tokenizer, rng);
  Tokens out = rewriter.sample(Tokens(sample.begin(), sample.end()));
  out.resize(sample.size(), options.tokens.pad);  // step 4: cut, or fill with the FIM pad token
  return out;
}

}  // namespace fp8tron::data
