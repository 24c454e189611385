#include "data/tokenizer_tiktoken.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/text.h"
#include "data/unicode.h"

#ifdef FP8TRON_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace fp8tron::data {
namespace {

// The two pre-tokenizer patterns of Megatron's tiktoken_tokenizer.py, verbatim.
constexpr const char* kPatternV1 = R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
constexpr const char* kPatternV2 =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::vector<std::string> kRequiredSpecials = {"<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"};
constexpr int64_t kDefaultVocab = int64_t(1) << 17;

std::string base64_decode(const std::string& in, const std::string& where) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  int bits = 0, acc = 0;
  for (char c : in) {
    if (c == '=') break;
    const int v = value(c);
    if (v < 0) throw UserError(where + ": token_bytes is not base64");
    acc = (acc << 6) | v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((acc >> bits) & 0xFF));
    }
  }
  return out;
}

}  // namespace

#ifdef FP8TRON_HAVE_PCRE2
bool tiktoken_available() { return true; }
struct TikTokenizer::Pattern {
  pcre2_code* code = nullptr;
  ~Pattern() { if (code) pcre2_code_free(code); }
};
#else
bool tiktoken_available() { return false; }
struct TikTokenizer::Pattern {};
#endif

TikTokenizer::TikTokenizer(const TokenizerOptions& o) : pattern_(std::make_unique<Pattern>()) {
#ifndef FP8TRON_HAVE_PCRE2
  throw UserError("TikTokenizer: fp8tron was built without libpcre2 (its patterns need Unicode regular expressions); "
                  "install libpcre2-dev and rebuild");
#else
  const std::string& path = o.tokenizer_model;
  if (path.size() < 5 || path.substr(path.size() - 5) != ".json")
    throw UserError("TikTokenizer needs --tokenizer-model FILE.json (a tiktoken rank list), got '" + path + "'");
  vocab_size_ = o.vocab_size.value_or(kDefaultVocab);
  num_special_ = o.tiktoken_num_special_tokens;
  specials_ = o.special_tokens.empty() ? kRequiredSpecials : o.special_tokens;
  const std::set<std::string> unique(specials_.begin(), specials_.end());
  if (unique.size() != specials_.size()) throw UserError("--tokenizer-special-tokens: the special tokens must be unique");
  for (const auto& s : kRequiredSpecials)
    if (!unique.count(s))
      throw UserError("--tokenizer-special-tokens must include " + join(kRequiredSpecials, " ") + " (missing " + s + ")");
  if (!(int64_t(specials_.size()) <= num_special_ && num_special_ < vocab_size_))
    throw UserError(strprintf("TikTokenizer: need (number of special tokens %zu) <= --tiktoken-num-special-tokens (%lld) < "
                              "--vocab-size (%lld)",
                              specials_.size(), (long long)num_special_, (long long)vocab_size_));
  for (int64_t i = int64_t(specials_.size()); i < num_special_; ++i) specials_.push_back("<SPECIAL_" + std::to_string(i) + ">");
  eod_ = int64_t(std::find(specials_.begin(), specials_.end(), "</s>") - specials_.begin());
  pad_ = int64_t(std::find(specials_.begin(), specials_.end(), "<pad>") - specials_.begin());

  std::ifstream in(path);
  if (!in) throw UserError("--tokenizer-model " + path + ": cannot open the file");
  nlohmann::json list;
  try {
    list = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError("--tokenizer-model " + path + ": not valid JSON (" + e.what() + ")");
  }
  if (!list.is_array()) throw UserError("--tokenizer-model " + path + ": expected a JSON list of {rank, token_bytes, token_str}");
  const int64_t inner = vocab_size_ - num_special_;
  if (int64_t(list.size()) < inner)
    throw UserError(strprintf("--tokenizer-model %s has %zu entries; --vocab-size %lld with %lld special tokens needs %lld",
                              path.c_str(), list.size(), (long long)vocab_size_, (long long)num_special_, (long long)inner));
  for (int64_t i = 0; i < inner; ++i) {
    const auto& e = list[size_t(i)];
    const std::string where = strprintf("--tokenizer-model %s entry %lld", path.c_str(), (long long)i);
    if (!e.is_object() || e.size() != 3 || !e.contains("rank") || !e.contains("token_bytes") || !e.contains("token_str"))
      throw UserError(where + ": expected exactly the keys rank, token_bytes, token_str");
    if (e["rank"].get<int64_t>() != i) throw UserError(where + ": rank must equal the position in the list");
    std::string bytes = base64_decode(e["token_bytes"].get<std::string>(), where);
    if (i < 256 && bytes != std::string(1, char(i))) throw UserError(where + ": the first 256 entries must be the single bytes");
    if (!ranks_.emplace(bytes, i + num_special_).second) throw UserError(where + ": duplicate token bytes");
    id_bytes_.push_back(std::move(bytes));
  }
  const std::string pattern = o.tiktoken_pattern.empty() || o.tiktoken_pattern == "v2" ? kPatternV2
                              : o.tiktoken_pattern == "v1" ? kPatternV1 : "";
  if (pattern.empty()) throw UserError("--tiktoken-pattern must be v1 or v2, got '" + o.tiktoken_pattern + "'");
  int error = 0;
  PCRE2_SIZE offset = 0;
  pattern_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                 &error, &offset, nullptr);
  FP8TRON_CHECK(pattern_->code != nullptr, "TikTokenizer: the pattern does not compile");
  pcre2_jit_compile(pattern_->code, PCRE2_JIT_COMPLETE);  // faster when JIT is available; fine without
#endif
}

TikTokenizer::~TikTokenizer() = default;

int64_t TikTokenizer::rank_of(std::string_view bytes) const {
  auto it = ranks_.find(std::string(bytes));
  return it == ranks_.end() ? -1 : it->second;
}

std::vector<int64_t> TikTokenizer::encode_piece(std::string_view piece) const {
  if (const int64_t id = rank_of(piece); id >= 0) return {id};
  // Part boundaries; merge the adjacent pair of lowest rank (leftmost on ties) until none is known.
  std::vector<size_t> bounds(piece.size() + 1);
  for (size_t i = 0; i <= piece.size(); ++i) bounds[i] = i;
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  auto pair_rank = [&](size_t i) {  // rank of parts i and i+1 merged
    const int64_t r = rank_of(piece.substr(bounds[i], bounds[i + 2] - bounds[i]));
    return r < 0 ? kNone : r;
  };
  while (bounds.size() > 2) {
    int64_t best = kNone;
    size_t at = 0;
    for (size_t i = 0; i + 2 < bounds.size(); ++i) {
      const int64_t r = pair_rank(i);
      if (r < best) { best = r; at = i; }
    }
    if (best == kNone) break;
    bounds.erase(bounds.begin() + long(at) + 1);
  }
  std::vector<int64_t> ids;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) ids.push_back(rank_of(piece.substr(bounds[i], bounds[i + 1] - bounds[i])));
  return ids;
}

void TikTokenizer::encode_ordinary(std::string_view text, std::vector<int64_t>& out) const {
#ifdef FP8TRON_HAVE_PCRE2
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(pattern_->code, nullptr);
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(pattern_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, 0, match, nullptr);
    if (rc < 0) break;  // no more pieces (every byte of valid text belongs to one)
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
    const size_t begin = ovector[0], end = ovector[1];
    if (end == begin) { pos = end + 1; continue; }  // the patterns never match empty text; be safe
    auto ids = encode_piece(text.substr(begin, end - begin));
    out.insert(out.end(), ids.begin(), ids.end());
    pos = end;
  }
  pcre2_match_data_free(match);
#else
  (void)text;
  (void)out;
#endif
}

std::vector<int64_t> TikTokenizer::tokenize(std::string_view raw) const {
  // Text reaches Python as a str: undecodable bytes would already be U+FFFD there.
  const std::string text = utf8_replace_invalid(raw);
  std::vector<int64_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    // The earliest special token from pos (the longest at one position).
    size_t best = std::string::npos, best_len = 0;
    int64_t best_id = -1;
    for (size_t id = 0; id < specials_.size(); ++id) {
      const size_t at = text.find(specials_[id], pos);
      if (at == std::string::npos) continue;
      if (at < best || (at == best && specials_[id].size() > best_len)) {
        best = at;
        best_len = specials_[id].size();
        best_id = int64_t(id);
      }
    }
    encode_ordinary(std::string_view(text).substr(pos, (best == std::string::npos ? text.size() : best) - pos), ids);
    if (best == std::string::npos) break;
    ids.push_back(best_id);
    pos = best + best_len;
  }
  return ids;
}

std::optional<int64_t> TikTokenizer::token_to_id(std::string_view token) const {
  for (size_t i = 0; i < specials_.size(); ++i)
    if (specials_[i] == token) return int64_t(i);
  return std::nullopt;
}

std::string TikTokenizer::detokenize(const std::vector<int64_t>& ids) const {
  std::string bytes;
  for (const int64_t id : ids) {
    if (id >= 0 && id < num_special_) bytes += specials_[size_t(id)];
    else if (id >= num_special_ && id < vocab_size_) bytes += id_bytes_[size_t(id - num_special_)];
    else throw UserError(strprintf("token id %lld is not in the TikTokenizer vocabulary", (long long)id));
  }
  return utf8_replace_invalid(bytes);
}

}  // namespace fp8tron::data
