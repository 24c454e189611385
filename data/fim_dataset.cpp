#include "data/fim_dataset.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::data {

FimDataset::FimDataset(std::shared_ptr<const SampleDataset> inner, std::shared_ptr<const Tokenizer> tokenizer,
                       FimOptions options, uint32_t seed)
    : inner_(std::move(inner)), tokenizer_(std::move(tokenizer)), options_(std::move(options)), seed_(seed) {
  FP8TRON_CHECK(inner_ && tokenizer_, "FimDataset needs a dataset and a tokenizer");
  FP8TRON_CHECK(inner_->size() <= int64_t(std::numeric_limits<uint32_t>::max()) + 1,
                "FIM seeds each sample by a 32-bit index");
}

void FimDataset::sample(int64_t index, int64_t* out) const {
  inner_->sample(index, out);
  const int64_t length = sample_length();
  const int64_t real = std::find(out, out + length, kPadTokenId) - out;
  NumpyRandomState rng(std::vector<uint32_t>{seed_, uint32_t(index)});
  const auto rewritten = fill_in_the_middle(std::span<const int64_t>(out, size_t(real)), options_, *tokenizer_, rng);
  std::copy(rewritten.begin(), rewritten.end(), out);
}

std::string FimDataset::identity() const {
  const FimTokenIds& t = options_.tokens;
  return inner_->identity() +
         strprintf("fim: rate %.17g spm_rate %.17g fragment_rate %s no_prefix %s tokens %lld %lld %lld %lld %lld "
                   "split %s seed %u tokenizer %s\n",
                   options_.rate, options_.spm_rate,
                   options_.fragment_rate ? strprintf("%.17g", *options_.fragment_rate).c_str() : "None",
                   options_.no_prefix ? ("\"" + *options_.no_prefix + "\"").c_str() : "None", (long long)t.prefix,
                   (long long)t.middle, (long long)t.suffix, (long long)t.pad, (long long)t.eod,
                   t.split_sample ? std::to_string(*t.split_sample).c_str() : "None", seed_,
                   tokenizer_->name().c_str());
}

std::string FimDataset::token_origin(int64_t index, int64_t /*position*/) const {
  const std::string first = inner_->token_origin(index, 0);
  if (first.empty()) return "";
  return "a sample rewritten by --fim-data whose text starts at " + first;
}

}  // namespace fp8tron::data
