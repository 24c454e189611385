#include "data/tokenizer_gpt2.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text.h"
#include "data/gpt2_pretokenizer.h"
#include "data/unicode.h"

namespace fp8tron::data {
namespace {

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(strprintf("cannot read the %s %s", what, path.c_str()));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// str.split() for the ASCII whitespace merges files contain (including a CRLF's '\r').
std::vector<std::string> split_whitespace(std::string_view line) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::string_view(" \t\r\v\f").find(line[i]) != std::string_view::npos) ++i;
    size_t j = i;
    while (j < line.size() && std::string_view(" \t\r\v\f").find(line[j]) == std::string_view::npos) ++j;
    if (j > i) parts.emplace_back(line.substr(i, j - i));
    i = j;
  }
  return parts;
}

}  // namespace

std::unordered_map<std::string, int64_t> load_vocab_json(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path, "vocabulary file"));
  } catch (const nlohmann::json::exception& e) {
    throw UserError(strprintf("--vocab-file %s is not valid JSON: %s", path.c_str(), e.what()));
  }
  if (!j.is_object()) throw UserError(strprintf("--vocab-file %s must be a JSON object of token -> id", path.c_str()));
  std::unordered_map<std::string, int64_t> vocab;
  vocab.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_number_integer())
      throw UserError(strprintf("--vocab-file %s: the id of token \"%s\" is not an integer", path.c_str(), it.key().c_str()));
    vocab[it.key()] = it.value().get<int64_t>();
  }
  return vocab;
}

std::vector<std::pair<std::string, std::string>> load_merges_txt(const std::string& path) {
  const std::string text = read_file(path, "merges file");
  // text.split('\n')[1:-1]: skip the header line and whatever follows the last newline.
  std::vector<std::pair<std::string, std::string>> merges;
  size_t start = text.find('\n');
  while (start != std::string::npos) {
    const size_t end = text.find('\n', start + 1);
    if (end == std::string::npos) break;
    auto parts = split_whitespace(std::string_view(text).substr(start + 1, end - start - 1));
    // A line that is not two symbols can never match a pair; the reference keeps it harmlessly.
    if (parts.size() == 2) merges.emplace_back(std::move(parts[0]), std::move(parts[1]));
    else merges.emplace_back("", "");  // a placeholder keeps the ranks of later lines unchanged
    start = end;
  }
  return merges;
}

std::string decode_byte_level(const std::unordered_map<int64_t, std::string>& decoder, const std::vector<int64_t>& ids) {
  std::string bytes;
  for (int64_t id : ids) {
    auto it = decoder.find(id);
    if (it == decoder.end()) throw UserError(strprintf("token id %lld is not in the vocabulary", (long long)id));
    const std::string& token = it->second;
    for (size_t i = 0; i < token.size();) {
      int len;
      const uint32_t cp = decode_utf8(token, i, &len);
      const int b = unicode_to_byte(cp);
      if (b < 0) {
        bytes.append(token, i, size_t(len));  // not a byte stand-in (an added token): keep as is
      } else {
        bytes += char(b);
      }
      i += size_t(len);
    }
  }
  return utf8_replace_invalid(bytes);
}

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file) {
  if (vocab_file.empty()) throw UserError("GPT2BPETokenizer needs --vocab-file (GPT-2's vocab.json)");
  if (merge_file.empty()) throw UserError("GPT2BPETokenizer needs --merge-file (GPT-2's merges.txt)");
  vocab_ = load_vocab_json(vocab_file);
  for (const auto& [token, id] : vocab_) decoder_[id] = token;
  auto eod = vocab_.find("<|endoftext|>");
  if (eod == vocab_.end())
    throw UserError(strprintf("--vocab-file %s has no <|endoftext|> token; is it a GPT-2 vocab.json?", vocab_file.c_str()));
  eod_ = eod->second;
  bpe_ = std::make_unique<ByteLevelBpe>(vocab_, load_merges_txt(merge_file), ByteLevelBpe::Options{0, false});
}

std::vector<int64_t> GPT2BPETokenizer::tokenize(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3);
  thread_local std::vector<Piece> pieces;
  gpt2_pretokenize(text, pieces);
  for (const Piece& p : pieces) bpe_->encode(text.substr(p.begin, p.length), ids);
  return ids;
}

std::optional<int64_t> GPT2BPETokenizer::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::string GPT2BPETokenizer::detokenize(const std::vector<int64_t>& ids) const { return decode_byte_level(decoder_, ids); }

}  // namespace fp8tron::data
