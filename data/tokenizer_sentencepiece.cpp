#include "data/tokenizer_sentencepiece.h"

#include <unordered_map>

#include "core/error.h"
#include "core/text.h"

#ifdef FP8TRON_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace fp8tron::data {

#ifdef FP8TRON_HAVE_SENTENCEPIECE

bool sentencepiece_available() { return true; }

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::unordered_map<int64_t, std::string> added_pieces;  // special tokens beyond the model's pieces

  std::vector<int64_t> encode(std::string_view text) const {
    std::vector<int> ids;
    sp.Encode(std::string(text), &ids);
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int64_t>& ids, size_t begin, size_t end) const {
    std::vector<int> part;
    for (size_t i = begin; i < end; ++i) {
      if (ids[i] < 0 || ids[i] >= sp.GetPieceSize())
        throw UserError(strprintf("token id %lld is not in the SentencePiece vocabulary", (long long)ids[i]));
      part.push_back(int(ids[i]));
    }
    std::string text;
    sp.Decode(part, &text);
    return text;
  }
  // id_to_piece, or `fallback` where Python's id_to_piece would raise (id -1 = "not defined").
  std::string piece_or(int id, const char* fallback) const {
    return id >= 0 && id < sp.GetPieceSize() ? sp.IdToPiece(id) : fallback;
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file, Flavor flavor)
    : impl_(std::make_unique<Impl>()), flavor_(flavor) {
  if (model_file.empty()) throw UserError(name() + " needs --tokenizer-model (a SentencePiece .model file)");
  const auto status = impl_->sp.Load(model_file);
  if (!status.ok())
    throw UserError(strprintf("cannot load the SentencePiece model %s: %s", model_file.c_str(), status.ToString().c_str()));
  vocab_size_ = impl_->sp.GetPieceSize();
  if (flavor_ != Flavor::Megatron) {
    eod_ = impl_->sp.eos_id();
    bos_ = impl_->sp.bos_id();
    return;
  }
  // _SentencePieceTokenizer._initalize: special tokens get their piece's id, or the next new id.
  std::unordered_map<std::string, int64_t> vocab;
  for (int i = 0; i < impl_->sp.GetPieceSize(); ++i) vocab[impl_->sp.IdToPiece(i)] = i;
  const auto add = [&](const std::string& token) {
    auto [it, inserted] = vocab.emplace(token, int64_t(vocab.size()));
    if (inserted) impl_->added_pieces[it->second] = token;
    for (const auto& s : special_)
      if (s.first == token) return it->second;
    special_.emplace_back(token, it->second);
    return it->second;
  };
  add("<CLS>");
  add("<SEP>");
  eod_ = add("<EOD>");
  add("<MASK>");
  add(impl_->piece_or(impl_->sp.pad_id(), "<PAD>"));
  bos_ = add(impl_->piece_or(impl_->sp.bos_id(), "<BOS>"));
  add(impl_->piece_or(impl_->sp.eos_id(), "<EOS>"));
  vocab_size_ = int64_t(vocab.size());
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int64_t> SentencePieceTokenizer::tokenize(std::string_view text) const {
  if (flavor_ == Flavor::GPT) return impl_->encode(text);
  if (flavor_ == Flavor::Llama2) {
    auto ids = impl_->encode(text);
    ids.insert(ids.begin(), bos_);
    return ids;
  }
  // Repeatedly cut at the earliest special token (the first listed wins a tie).
  std::vector<int64_t> ids;
  size_t pos = 0;
  while (true) {
    size_t best = std::string_view::npos;
    const std::pair<std::string, int64_t>* token = nullptr;
    for (const auto& s : special_) {
      if (s.first.empty()) continue;
      const size_t at = text.find(s.first, pos);
      if (at != std::string_view::npos && (best == std::string_view::npos || at < best)) {
        best = at;
        token = &s;
      }
    }
    if (!token) break;
    auto part = impl_->encode(text.substr(pos, best - pos));
    ids.insert(ids.end(), part.begin(), part.end());
    ids.push_back(token->second);
    pos = best + token->first.size();
  }
  auto rest = impl_->encode(text.substr(pos));
  ids.insert(ids.end(), rest.begin(), rest.end());
  return ids;
}

std::string SentencePieceTokenizer::detokenize(const std::vector<int64_t>& ids) const {
  if (flavor_ != Flavor::Megatron) return impl_->decode(ids, 0, ids.size());
  // Special tokens are spelled out with a space on each side, as the reference does.
  std::unordered_map<int64_t, std::string> special;
  for (const auto& s : special_) special[s.second] = s.first;
  std::string text;
  size_t last = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = special.find(ids[i]);
    if (it == special.end()) continue;
    text += impl_->decode(ids, last, i) + " " + it->second + " ";
    last = i + 1;
  }
  return text + impl_->decode(ids, last, ids.size());
}

#else  // !FP8TRON_HAVE_SENTENCEPIECE

bool sentencepiece_available() { return false; }
struct SentencePieceTokenizer::Impl {};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string&, Flavor flavor) : flavor_(flavor) {
  throw UserError(name() + ": fp8tron was built without libsentencepiece; install libsentencepiece-dev and rebuild");
}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;
std::vector<int64_t> SentencePieceTokenizer::tokenize(std::string_view) const { return {}; }
std::string SentencePieceTokenizer::detokenize(const std::vector<int64_t>&) const { return {}; }

#endif

std::string SentencePieceTokenizer::name() const {
  switch (flavor_) {
    case Flavor::Megatron: return "SentencePieceTokenizer";
    case Flavor::GPT: return "GPTSentencePieceTokenizer";
    case Flavor::Llama2: return "Llama2Tokenizer";
  }
  return "";
}

}  // namespace fp8tron::data
