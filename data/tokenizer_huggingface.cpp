#include "data/tokenizer_huggingface.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text.h"
#include "data/gpt2_pretokenizer.h"
#include "data/tokenizer_gpt2.h"
#include "data/unicode.h"

namespace fp8tron::data {
namespace {

using nlohmann::json;

constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(strprintf("cannot read %s", path.c_str()));
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw UserError(strprintf("%s is not valid JSON: %s", path.c_str(), e.what()));
  }
}

std::string type_of(const json& j) { return j.is_object() ? j.value("type", std::string("?")) : "null"; }

// A token given as "text" or {"content": "text", ...} in tokenizer_config.json.
std::string token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content")) return j["content"].get<std::string>();
  return "";
}

bool is_space_at(std::string_view s, size_t i, int* len) {
  return char_class(decode_utf8(s, i, len)) == CharClass::Space;
}

}  // namespace

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::string& path) {
  if (path.empty()) throw UserError("HuggingFaceTokenizer needs --tokenizer-model (a tokenizer.json or its directory)");
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "tokenizer.json";
  if (!std::filesystem::exists(p))
    throw UserError(strprintf("--tokenizer-model %s: no such tokenizer.json (fp8tron reads local files only; "
                              "download the tokenizer first)", path.c_str()));
  path_ = p.string();
  load(path_);
}

void HuggingFaceTokenizer::load(const std::string& json_path) {
  const json j = read_json(json_path);
  const auto unsupported = [&](const std::string& what) {
    return UserError(strprintf("%s: %s is not supported (fp8tron's HuggingFaceTokenizer handles byte-level BPE "
                               "tokenizers such as GPT-2's)", json_path.c_str(), what.c_str()));
  };
  const json& model = j.at("model");
  if (type_of(model) != "BPE") throw unsupported("model type " + type_of(model));
  if (!j.value("normalizer", json()).is_null()) throw unsupported("normalizer " + type_of(j["normalizer"]));
  if (model.value("byte_fallback", false)) throw unsupported("byte_fallback");
  if (!model.value("continuing_subword_prefix", json()).is_null() && model["continuing_subword_prefix"] != "")
    throw unsupported("continuing_subword_prefix");
  if (!model.value("end_of_word_suffix", json()).is_null() && model["end_of_word_suffix"] != "")
    throw unsupported("end_of_word_suffix");

  // Pre-tokenizer: ByteLevel, or Split(GPT-2 pattern) + ByteLevel(use_regex=false).
  const json pre = j.value("pre_tokenizer", json());
  json byte_level;
  if (type_of(pre) == "ByteLevel") {
    byte_level = pre;
  } else if (type_of(pre) == "Sequence" && pre["pretokenizers"].size() == 2 &&
             type_of(pre["pretokenizers"][0]) == "Split" && type_of(pre["pretokenizers"][1]) == "ByteLevel") {
    const json& split = pre["pretokenizers"][0];
    const std::string pattern = split["pattern"].value("Regex", split["pattern"].value("String", std::string()));
    if (pattern != kGpt2Pattern || split.value("behavior", "") != "Isolated" || split.value("invert", false))
      throw unsupported("pre-tokenizer Split pattern " + pattern);
    byte_level = pre["pretokenizers"][1];
    byte_level["use_regex"] = true;  // the Split does exactly what use_regex would
  } else {
    throw unsupported("pre-tokenizer " + type_of(pre));
  }
  add_prefix_space_ = byte_level.value("add_prefix_space", false);
  use_regex_ = byte_level.value("use_regex", true);
  const std::string decoder_type = type_of(j.value("decoder", json()));
  if (decoder_type != "ByteLevel" && decoder_type != "null") throw unsupported("decoder " + decoder_type);

  std::unordered_map<std::string, int64_t> vocab;
  for (auto it = model.at("vocab").begin(); it != model.at("vocab").end(); ++it) vocab[it.key()] = it.value().get<int64_t>();
  std::vector<std::pair<std::string, std::string>> merges;
  for (const json& m : model.value("merges", json::array())) {
    if (m.is_array() && m.size() == 2) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        throw UserError(strprintf("%s: merge \"%s\" is not two symbols", json_path.c_str(), s.c_str()));
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    }
  }
  int64_t unknown = -1;  // without an unk_token, HF drops symbols missing from the vocabulary
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = vocab.find(model["unk_token"].get<std::string>());
    if (it != vocab.end()) unknown = it->second;
  }
  std::unordered_set<std::string> tokens;
  for (const auto& [token, id] : vocab) {
    decoder_[id] = token;
    tokens.insert(token);
  }
  token_ids_ = vocab;
  unknown_ = unknown;
  std::unordered_map<std::string, int64_t> special_ids;
  for (const json& a : j.value("added_tokens", json::array())) {
    AddedToken t{a.at("content").get<std::string>(), a.at("id").get<int64_t>(), a.value("lstrip", false),
                 a.value("rstrip", false), a.value("single_word", false)};
    if (t.content.empty()) continue;
    decoder_[t.id] = t.content;
    tokens.insert(t.content);
    special_ids[t.content] = t.id;
    token_ids_[t.content] = t.id;
    if (a.value("special", false)) special_.insert(t.id);
    added_.push_back(t);
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  vocab_size_ = int64_t(tokens.size());
  bpe_ = std::make_unique<ByteLevelBpe>(vocab, merges, ByteLevelBpe::Options{unknown, model.value("ignore_merges", false)});

  // Post-processor: the special tokens tokenizer(text) adds around the text.
  std::vector<json> processors;
  const json post = j.value("post_processor", json());
  if (type_of(post) == "Sequence") {
    for (const json& p : post["processors"]) processors.push_back(p);
  } else if (!post.is_null()) {
    processors.push_back(post);
  }
  for (const json& p : processors) {
    const std::string type = type_of(p);
    if (type == "ByteLevel") continue;
    if (type == "TemplateProcessing") {
      bool after = false;
      for (const json& item : p.at("single")) {
        if (item.contains("Sequence")) { after = true; continue; }
        const std::string id = item.at("SpecialToken").at("id").get<std::string>();
        for (const json& v : p.at("special_tokens").at(id).at("ids")) (after ? suffix_ids_ : prefix_ids_).push_back(v.get<int64_t>());
      }
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
      prefix_ids_.push_back(p.at("cls").at(1).get<int64_t>());
      suffix_ids_.push_back(p.at("sep").at(1).get<int64_t>());
    } else {
      throw unsupported("post-processor " + type);
    }
  }

  // The end-of-document token: the eos_token of tokenizer_config.json or special_tokens_map.json,
  // else the usual end-of-text names.
  const auto dir = std::filesystem::path(json_path).parent_path();
  for (const char* file : {"tokenizer_config.json", "special_tokens_map.json"}) {
    if (eod_ >= 0 || !std::filesystem::exists(dir / file)) continue;
    const json config = read_json((dir / file).string());
    const std::string eos = config.contains("eos_token") ? token_text(config["eos_token"]) : "";
    if (auto it = special_ids.find(eos); it != special_ids.end()) eod_ = it->second;
    else if (auto v = vocab.find(eos); !eos.empty() && v != vocab.end()) eod_ = v->second;
  }
  // The unknown token Hugging Face's convert_tokens_to_ids falls back to (--fim-data's lookups).
  for (const char* file : {"tokenizer_config.json", "special_tokens_map.json"}) {
    if (!std::filesystem::exists(dir / file)) continue;
    const json config = read_json((dir / file).string());
    const std::string unk = config.contains("unk_token") ? token_text(config["unk_token"]) : "";
    if (auto it = token_ids_.find(unk); !unk.empty() && it != token_ids_.end()) {
      unknown_ = it->second;
      break;
    }
  }
  for (const char* name : {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>"}) {
    if (eod_ >= 0) break;
    if (auto it = special_ids.find(name); it != special_ids.end()) eod_ = it->second;
    else if (auto v = vocab.find(name); v != vocab.end()) eod_ = v->second;
  }
}

std::optional<int64_t> HuggingFaceTokenizer::token_to_id(std::string_view token) const {
  auto it = token_ids_.find(std::string(token));
  if (it == token_ids_.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> HuggingFaceTokenizer::unknown_id() const {
  if (unknown_ < 0) return std::nullopt;
  return unknown_;
}

bool HuggingFaceTokenizer::is_special(int64_t id) const { return special_.count(id) > 0 || id == eod_; }

int64_t HuggingFaceTokenizer::eod() const {
  if (eod_ < 0)
    throw UserError(strprintf("%s defines no end-of-document token (no eos_token in tokenizer_config.json)", path_.c_str()));
  return eod_;
}

const HuggingFaceTokenizer::AddedToken* HuggingFaceTokenizer::match_added(std::string_view text, size_t pos,
                                                                          size_t* length) const {
  for (const AddedToken& t : added_) {  // longest first
    if (text.compare(pos, t.content.size(), t.content) != 0) continue;
    size_t end = pos + t.content.size();
    if (t.single_word) {
      int len;
      const bool word_before = pos > 0 && char_class(decode_utf8(text, pos - 1, &len)) == CharClass::Letter;
      const bool word_after = end < text.size() && char_class(decode_utf8(text, end, &len)) == CharClass::Letter;
      if (word_before || word_after) continue;
    }
    int len;
    if (t.rstrip)
      while (end < text.size() && is_space_at(text, end, &len)) end += size_t(len);
    *length = end - pos;
    return &t;
  }
  return nullptr;
}

void HuggingFaceTokenizer::encode_segment(std::string_view segment, std::vector<int64_t>& out) const {
  if (segment.empty()) return;
  std::string owned;
  if (add_prefix_space_ && segment[0] != ' ') {
    owned = " " + std::string(segment);
    segment = owned;
  }
  if (!use_regex_) {
    bpe_->encode(segment, out);
    return;
  }
  thread_local std::vector<Piece> pieces;
  gpt2_pretokenize(segment, pieces);
  for (const Piece& p : pieces) bpe_->encode(segment.substr(p.begin, p.length), out);
}

std::vector<int64_t> HuggingFaceTokenizer::tokenize(std::string_view text) const {
  std::vector<int64_t> ids(prefix_ids_);
  size_t start = 0;  // start of the text not yet encoded
  for (size_t pos = 0; pos < text.size();) {
    size_t length = 0;
    const AddedToken* t = added_.empty() ? nullptr : match_added(text, pos, &length);
    if (!t) {
      ++pos;
      continue;
    }
    size_t segment_end = pos;
    while (t->lstrip && segment_end > start) {  // the token swallows the whitespace before it
      size_t k = segment_end - 1;
      while (k > start && (text[k] & 0xC0) == 0x80) --k;  // back to the start of the code point
      int len;
      if (!is_space_at(text, k, &len)) break;
      segment_end = k;
    }
    encode_segment(text.substr(start, segment_end - start), ids);
    ids.push_back(t->id);
    pos += length;
    start = pos;
  }
  encode_segment(text.substr(start), ids);
  ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string HuggingFaceTokenizer::detokenize(const std::vector<int64_t>& ids) const { return decode_byte_level(decoder_, ids); }

}  // namespace fp8tron::data
