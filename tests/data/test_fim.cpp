// --fim-data: Megatron's fill-in-the-middle rewrite (data/fim_transform.h), its dataset
// (data/fim_dataset.h) and its tokens (data/fim_tokens.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/fim_dataset.h"
#include "data/fim_tokens.h"
#include "data/fim_transform.h"
#include "data/tokenizer_gpt2.h"
#include "test_util.h"

namespace fp8tron::data {
namespace {

using Tokens = std::vector<int64_t>;

// The word tokenizer of tests/data/fim_megatron_reference.py: ids 0-25 'a'-'z', then ' ', "ab",
// "cd", '|', 'é'; 31-35 the special tokens. Greedy longest match over the non-special entries.
class WordTokenizer : public Tokenizer {
 public:
  static constexpr int64_t kPre = 31, kMid = 32, kSuf = 33, kPad = 34, kEod = 35, kSplit = 29;

  WordTokenizer() {
    for (char c = 'a'; c <= 'z'; ++c) words_.push_back(std::string(1, c));
    for (const char* w : {" ", "ab", "cd", "|", "é", "<pre>", "<mid>", "<suf>", "<pad>", "<eod>"}) words_.push_back(w);
  }
  Tokens tokenize(std::string_view text) const override {
    Tokens ids;
    for (size_t i = 0; i < text.size();) {
      int64_t best = -1;
      for (int64_t k = 0; k < kPre; ++k)
        if (text.substr(i).starts_with(words_[size_t(k)]) && (best < 0 || words_[size_t(k)].size() > words_[size_t(best)].size()))
          best = k;
      if (best < 0) throw UserError("no token for " + std::string(text.substr(i)));
      ids.push_back(best);
      i += words_[size_t(best)].size();
    }
    return ids;
  }
  std::string detokenize(const Tokens& ids) const override {
    std::string text;
    for (int64_t id : ids) text += words_.at(size_t(id));
    return text;
  }
  int64_t vocab_size() const override { return int64_t(words_.size()); }
  int64_t eod() const override { return kEod; }
  std::string name() const override { return "HuggingFaceTokenizer"; }
  std::optional<int64_t> token_to_id(std::string_view token) const override {
    auto it = std::find(words_.begin(), words_.end(), token);
    if (it == words_.end()) return std::nullopt;
    return int64_t(it - words_.begin());
  }
  bool is_special(int64_t id) const override { return id >= kPre; }

 private:
  std::vector<std::string> words_;
};

FimOptions options(double rate, double spm_rate) {
  FimOptions o;
  o.rate = rate;
  o.spm_rate = spm_rate;
  o.tokens = {WordTokenizer::kPre, WordTokenizer::kMid, WordTokenizer::kSuf, WordTokenizer::kPad, WordTokenizer::kEod,
              std::nullopt};
  return o;
}

// Sample `index` rewritten as FimDataset rewrites it: from RandomState([seed, index]).
Tokens rewrite(const Tokens& sample, const FimOptions& o, uint32_t seed = 1234, uint32_t index = 0) {
  WordTokenizer tokenizer;
  NumpyRandomState rng(std::vector<uint32_t>{seed, index});
  return fill_in_the_middle(sample, o, tokenizer, rng);
}

// "abcdabcdabcd" as twelve one-letter tokens. numpy.random.RandomState([1234, 24]) cuts it after 5
// and 8 characters: prefix "abcda" -> ab cd a, middle "bcd" -> b cd, suffix "abcd" -> ab cd. The
// pieces re-tokenize to 7 tokens, the three markers make 10, and two FIM pads fill the 12.
const Tokens kHandMade = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};

TEST(FimTransform, PsmLayoutByHand) {
  constexpr int64_t P = WordTokenizer::kPre, M = WordTokenizer::kMid, S = WordTokenizer::kSuf, X = WordTokenizer::kPad;
  //                       <pre> prefix      <suf> suffix  <mid> middle
  EXPECT_EQ(rewrite(kHandMade, options(1.0, 0.0), 1234, 24), (Tokens{P, 27, 28, 0, S, 27, 28, M, 1, 28, X, X}));
}

TEST(FimTransform, SpmLayoutByHand) {
  constexpr int64_t P = WordTokenizer::kPre, M = WordTokenizer::kMid, S = WordTokenizer::kSuf, X = WordTokenizer::kPad;
  //                       <pre> <suf> suffix <mid> prefix     middle
  EXPECT_EQ(rewrite(kHandMade, options(1.0, 1.0), 1234, 24), (Tokens{P, S, 27, 28, M, 27, 28, 0, 1, 28, X, X}));
}

struct GoldenCase {
  const char* name;
  Tokens tokens;
  double rate, spm_rate;
  std::optional<int64_t> split;
  std::optional<double> fragment_rate;
  std::optional<std::string> no_prefix;
  uint32_t seed, index;
  Tokens expected;
};

// Megatron's GPTFIMDataset on the same tokens with the same generator (fim_megatron_reference.py).
TEST(FimTransform, MatchesMegatron) {
  const std::vector<GoldenCase> cases = {
#include "fim_megatron_golden.inc"
  };
  ASSERT_GE(cases.size(), 20u);
  for (const auto& c : cases) {
    FimOptions o = options(c.rate, c.spm_rate);
    o.tokens.split_sample = c.split;
    o.fragment_rate = c.fragment_rate;
    o.no_prefix = c.no_prefix;
    EXPECT_EQ(rewrite(c.tokens, o, c.seed, c.index), c.expected) << c.name;
  }
}

// Samples of every shape: segments, empty segments, merges that shorten, split tokens.
std::vector<Tokens> varied_samples() {
  WordTokenizer t;
  const Tokens eod = {WordTokenizer::kEod};
  std::vector<Tokens> out;
  for (const char* text : {"abcdefgh", "the cat sat|on a mat", "ab|cd||ef|", "éaé b|c", "xyz"}) {
    Tokens a = t.tokenize(text);
    out.push_back(a);
    Tokens b = a;
    b.insert(b.end(), eod.begin(), eod.end());
    b.insert(b.end(), a.begin(), a.end());
    out.push_back(b);
    Tokens c = eod;
    c.insert(c.end(), a.begin(), a.end());
    c.insert(c.end(), eod.begin(), eod.end());
    c.insert(c.end(), eod.begin(), eod.end());
    out.push_back(c);
  }
  out.push_back(Tokens{0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1});  // re-tokenizes much shorter
  return out;
}

// Rate 0 rewrites nothing, but the cut at end-of-document tokens still drops the empty segments
// (a leading one, or one between two of them) with their end-of-document token, as in Megatron.
TEST(FimTransform, RateZeroLeavesSamplesButDropsEmptySegments) {
  for (const Tokens& s : varied_samples()) {
    Tokens kept;
    for (size_t i = 0; i < s.size(); ++i)
      if (!(s[i] == WordTokenizer::kEod && (i == 0 || s[i - 1] == WordTokenizer::kEod))) kept.push_back(s[i]);
    kept.resize(s.size(), WordTokenizer::kPad);
    for (uint32_t index = 0; index < 5; ++index) EXPECT_EQ(rewrite(s, options(0.0, 0.5), 1234, index), kept);
  }
}

TEST(FimTransform, RateOneRewritesEverySegment) {
  WordTokenizer t;
  const Tokens sample = t.tokenize("abcdefghijklmnopqrstuvwxyz");
  for (uint32_t index = 0; index < 20; ++index) {
    const Tokens out = rewrite(sample, options(1.0, 0.5), 1234, index);
    EXPECT_EQ(out[0], WordTokenizer::kPre);
    EXPECT_EQ(std::count(out.begin(), out.end(), WordTokenizer::kSuf), 1);
  }
  // Two documents: both start with the prefix marker (the second after the end of the first).
  Tokens two = t.tokenize("abcd");
  two.push_back(WordTokenizer::kEod);
  for (int64_t id : t.tokenize("efghijklmnop")) two.push_back(id);
  for (uint32_t index = 0; index < 20; ++index) {
    const Tokens out = rewrite(two, options(1.0, 0.0), 1234, index);
    const auto eod = std::find(out.begin(), out.end(), WordTokenizer::kEod);
    ASSERT_NE(eod, out.end());
    EXPECT_EQ(out[0], WordTokenizer::kPre);
    EXPECT_EQ(*(eod + 1), WordTokenizer::kPre);
  }
}

TEST(FimTransform, SplitSampleRewritesEachFragment) {
  WordTokenizer t;
  const Tokens sample = t.tokenize("abcdefghijklmnop|qrstuvwxyzabcdefg");
  FimOptions o = options(1.0, 0.5);
  o.tokens.split_sample = WordTokenizer::kSplit;
  o.fragment_rate = 1.0;
  for (uint32_t index = 0; index < 20; ++index) {
    const Tokens out = rewrite(sample, o, 1234, index);
    const auto split = std::find(out.begin(), out.end(), WordTokenizer::kSplit);
    ASSERT_NE(split, out.end());
    EXPECT_EQ(out[0], WordTokenizer::kPre);
    EXPECT_EQ(*(split + 1), WordTokenizer::kPre);  // Megatron's own test checks this
  }
  o.fragment_rate = 0.0;  // the sample is split, but no fragment rewritten
  for (uint32_t index = 0; index < 5; ++index) EXPECT_EQ(rewrite(sample, o, 1234, index), sample);
}

TEST(FimTransform, FragmentRateSetsTheShareOfFragments) {
  WordTokenizer t;
  Tokens sample;
  for (int i = 0; i < 40; ++i) {
    for (int64_t id : t.tokenize("abcdefgh")) sample.push_back(id);
    sample.push_back(WordTokenizer::kSplit);
  }
  FimOptions o = options(1.0, 0.5);
  o.tokens.split_sample = WordTokenizer::kSplit;
  o.fragment_rate = 0.25;
  int rewritten = 0, fragments = 0;
  for (uint32_t index = 0; index < 50; ++index) {
    const Tokens out = rewrite(sample, o, 1234, index);
    rewritten += int(std::count(out.begin(), out.end(), WordTokenizer::kPre));
    fragments += 40;
  }
  EXPECT_NEAR(double(rewritten) / fragments, 0.25, 0.04);
}

TEST(FimTransform, NoPrefixLeavesMatchingSegments) {
  WordTokenizer t;
  Tokens sample = t.tokenize("abcdef");
  sample.push_back(WordTokenizer::kEod);
  const size_t second = sample.size();
  for (int64_t id : t.tokenize("xyzabcdefgh")) sample.push_back(id);
  FimOptions o = options(1.0, 0.5);
  o.no_prefix = "ab";
  for (uint32_t index = 0; index < 10; ++index) {
    const Tokens out = rewrite(sample, o, 1234, index);
    EXPECT_TRUE(std::equal(sample.begin(), sample.begin() + long(second), out.begin())) << index;  // "ab..." kept
    EXPECT_EQ(out[second], WordTokenizer::kPre) << index;  // "xyz..." rewritten
  }
}

TEST(FimTransform, KeepsTheLength) {
  for (const double rate : {0.3, 1.0})
    for (const Tokens& s : varied_samples())
      for (uint32_t index = 0; index < 10; ++index) {
        FimOptions o = options(rate, 0.5);
        o.tokens.split_sample = WordTokenizer::kSplit;
        o.fragment_rate = 0.7;
        const Tokens out = rewrite(s, o, 99, index);
        EXPECT_EQ(out.size(), s.size());
      }
  // Shorter after re-tokenizing: filled with the FIM pad token.
  const Tokens out = rewrite(Tokens{0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1}, options(1.0, 0.5), 1234, 0);
  EXPECT_EQ(out.back(), WordTokenizer::kPad);
}

// An in-memory dataset of fixed samples.
class ListDataset : public SampleDataset {
 public:
  explicit ListDataset(std::vector<Tokens> samples) : samples_(std::move(samples)) {}
  int64_t size() const override { return int64_t(samples_.size()); }
  int64_t sample_length() const override { return int64_t(samples_[0].size()); }
  void sample(int64_t index, int64_t* out) const override {
    std::copy(samples_[size_t(index)].begin(), samples_[size_t(index)].end(), out);
  }
  std::string identity() const override { return "list\n"; }

 private:
  std::vector<Tokens> samples_;
};

Tokens read(const SampleDataset& d, int64_t index) {
  Tokens out(size_t(d.sample_length()));
  d.sample(index, out.data());
  return out;
}

TEST(FimDataset, EachSampleHasItsOwnDraws) {
  WordTokenizer t;
  std::vector<Tokens> samples;
  for (int i = 0; i < 8; ++i) samples.push_back(t.tokenize("the cat sat on a mat"));
  const auto tokenizer = std::make_shared<WordTokenizer>();
  FimDataset fim(std::make_shared<ListDataset>(samples), tokenizer, options(0.5, 0.5), 1234);
  // Any order of reads (another data-parallel layout, a resume) gives the same samples.
  std::vector<Tokens> forward, backward(8);
  for (int64_t i = 0; i < 8; ++i) forward.push_back(read(fim, i));
  for (int64_t i = 7; i >= 0; --i) backward[size_t(i)] = read(fim, i);
  EXPECT_EQ(forward, backward);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(forward[size_t(i)], rewrite(samples[0], options(0.5, 0.5), 1234, uint32_t(i)));
  // The same text comes out differently at different indices, and with another seed.
  EXPECT_GT(std::set<Tokens>(forward.begin(), forward.end()).size(), 2u);
  FimDataset other(std::make_shared<ListDataset>(samples), tokenizer, options(0.5, 0.5), 4321);
  int differ = 0;
  for (int64_t i = 0; i < 8; ++i) differ += read(other, i) != forward[size_t(i)];
  EXPECT_GT(differ, 0);
  EXPECT_NE(fim.identity(), other.identity());
}

TEST(FimDataset, LeavesPositionsPastTheData) {
  WordTokenizer t;
  Tokens partial = t.tokenize("abcdefgh");
  partial.resize(12, kPadTokenId);  // the last validation sample can run out of data
  const auto tokenizer = std::make_shared<WordTokenizer>();
  FimDataset fim(std::make_shared<ListDataset>(std::vector<Tokens>{partial}), tokenizer, options(1.0, 0.5), 1234);
  const Tokens out = read(fim, 0);
  EXPECT_EQ(out[0], WordTokenizer::kPre);
  EXPECT_TRUE(std::all_of(out.begin() + 6, out.end(), [](int64_t id) { return id == kPadTokenId; }));
}

// GPT-2's vocabulary has none of the default FIM tokens: as in Megatron (Hugging Face's GPT-2
// tokenizer) they become "<|endoftext|>", each said in a warning.
TEST(FimTokens, Gpt2FallsBackToEndOfText) {
  testing::ScratchDir dir;
  testing::write_file(dir / "vocab.json", R"({"a": 0, "b": 1, "<fim_middle>": 2, "<|endoftext|>": 3})");
  testing::write_file(dir / "merges.txt", "#version: 0.2\n");
  GPT2BPETokenizer gpt2(dir / "vocab.json", dir / "merges.txt");
  FimConfig config;
  config.enabled = true;
  std::vector<std::string> warnings;
  const FimOptions o = fim_options(config, gpt2, &warnings);
  EXPECT_EQ(o.tokens.prefix, 3);
  EXPECT_EQ(o.tokens.middle, 2);  // in the vocabulary
  EXPECT_EQ(o.tokens.suffix, 3);
  EXPECT_EQ(o.tokens.pad, 3);
  EXPECT_EQ(o.tokens.eod, 3);
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_NE(warnings[0].find("--fim-prefix-token \"<fim_prefix>\""), std::string::npos) << warnings[0];
  EXPECT_TRUE(gpt2.is_special(3));
  EXPECT_FALSE(gpt2.is_special(2));
}

TEST(FimTokens, MissingTokenWithoutUnknownIsAnError) {
  WordTokenizer t;  // no unknown token
  FimConfig config;
  config.enabled = true;
  try {
    fim_options(config, t, nullptr);
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("--fim-prefix-token \"<fim_prefix>\" is not a token"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
  config.prefix_token = "<pre>";
  config.middle_token = "<mid>";
  config.suffix_token = "<suf>";
  config.pad_token = "<pad>";
  config.eod_token = "<eod>";
  config.split_sample = "|";
  const FimOptions o = fim_options(config, t, nullptr);
  EXPECT_EQ(o.tokens.split_sample, WordTokenizer::kSplit);
  EXPECT_TRUE(tokenizer_supports_fim("TikTokenizer"));
  EXPECT_FALSE(tokenizer_supports_fim("SentencePieceTokenizer"));
  EXPECT_FALSE(tokenizer_supports_fim("NullTokenizer"));
}

// numpy.random.RandomState([1234, 7]): the words, binomial(1, p) and randint(0, 101, size=2) of
// numpy 2.4 (legacy binomial draws a double even for p = 0 and p = 1).
TEST(NumpyRandomState, ArraySeedBinomialAndRandintMatchNumpy) {
  NumpyRandomState words(std::vector<uint32_t>{1234, 7});
  const uint32_t first = words.next_uint32();
  EXPECT_EQ(first, 342877954u);
  EXPECT_EQ(words.next_uint32(), 1195687222u);
  NumpyRandomState rng(std::vector<uint32_t>{1234, 7});
  std::vector<int64_t> draws;
  for (double p : {0.0, 1.0, 0.5, 0.3, 0.9, 0.999999}) draws.push_back(rng.binomial_one(p));
  EXPECT_EQ(draws, (std::vector<int64_t>{0, 1, 1, 1, 1, 1}));
  const uint64_t a = rng.random_interval(100);
  EXPECT_EQ(a, 12u);
  EXPECT_EQ(rng.random_interval(100), 71u);
}

}  // namespace
}  // namespace fp8tron::data
