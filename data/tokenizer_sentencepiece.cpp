#include "data/tokenizer_sentencepiece.h"

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
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file, Flavor flavor)
    : impl_(std::make_unique<Impl>()), flavor_(flavor) {
  if (model_file.empty()) throw UserError(name() + " needs --tokenizer-model (a SentencePiece .model file)");
  const auto status = impl_->sp.Load(model_file);
  if (!status.ok())
    throw UserError(strprintf("cannot load the SentencePiece model %s: %s", model_file.c_str(), status.ToString().c_str()));
  vocab_size_ = impl_->sp.GetPieceSize();
  eod_ = impl_->sp.eos_id();
  pad_ = impl_->sp.pad_id();
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int64_t> SentencePieceTokenizer::tokenize(std::string_view text) const {
  std::vector<int> ids;
  impl_->sp.Encode(std::string(text), &ids);
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::detokenize(const std::vector<int64_t>& ids) const {
  std::vector<int> part;
  for (const int64_t id : ids) {
    if (id < 0 || id >= impl_->sp.GetPieceSize())
      throw UserError(strprintf("token id %lld is not in the SentencePiece vocabulary", (long long)id));
    part.push_back(int(id));
  }
  std::string text;
  impl_->sp.Decode(part, &text);
  return text;
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
    case Flavor::SentencePiece: return "SentencePieceTokenizer";
    case Flavor::GPT: return "GPTSentencePieceTokenizer";
    case Flavor::Llama2: return "Llama2Tokenizer";
  }
  return "";
}

}  // namespace fp8tron::data
