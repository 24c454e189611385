#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/byte_level_bpe.h"
#include "data/tokenizer.h"
#include "data/tokenizer_sentencepiece.h"
#include "data/tokenizer_tiktoken.h"
#include "data/unicode.h"
#include "test_util.h"

#ifdef FP8TRON_TEST_SENTENCEPIECE_TRAINER
#include <sentencepiece_trainer.h>
#endif

namespace fp8tron::data {
namespace {

using testing::ScratchDir;

TEST(NullTokenizer, IdsSeparatedBySpaces) {
  TokenizerOptions o;
  o.type = "NullTokenizer";
  o.vocab_size = 1000;
  auto tok = build_tokenizer(o);
  EXPECT_EQ(tok->tokenize("1 2 999"), (std::vector<int64_t>{1, 2, 999}));
  EXPECT_EQ(tok->tokenize("7\n"), std::vector<int64_t>{7});
  EXPECT_EQ(tok->detokenize({3, 4}), "3 4");
  // Megatron-LM d98e8a6: --vocab-size ids, the last one the end-of-document id.
  EXPECT_EQ(tok->vocab_size(), 1000);
  EXPECT_EQ(tok->eod(), 999);
  o.null_eod_id = 0;  // --null-tokenizer-eod-id
  EXPECT_EQ(build_tokenizer(o)->eod(), 0);
  o.null_eod_id.reset();
  EXPECT_USER_ERROR(tok->tokenize("1  2"), "not an integer");
  EXPECT_USER_ERROR(tok->tokenize("a"), "'a'");
  o.vocab_size.reset();
  EXPECT_USER_ERROR(build_tokenizer(o), "--vocab-size");
}

TEST(TokenizerFactory, UnknownTypeSuggests) {
  TokenizerOptions o;
  o.type = "GPT2BPETokenzier";
  EXPECT_USER_ERROR(build_tokenizer(o), "GPT2BPETokenzier", "did you mean GPT2BPETokenizer");
  o.type = "HuggingFaceTokenizer";
  o.tokenizer_model = "/nonexistent/gpt2";
  EXPECT_USER_ERROR(build_tokenizer(o), "/nonexistent/gpt2", "local files");
}

// A tokenizer.json with GPT-2's layout around a tiny BPE: "h e" -> he, "Ġ w" -> Ġw, "Ġw o" -> Ġwo.
nlohmann::json tiny_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_unicode(uint8_t(b)));
    vocab[s] = b;
  }
  vocab["he"] = 256;
  vocab["Ġw"] = 257;
  vocab["Ġwo"] = 258;
  vocab["<|endoftext|>"] = 259;
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens", {{{"id", 259}, {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false},
                         {"rstrip", false}, {"normalized", true}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                 {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
                 {"merges", {"h e", "Ġ w", "Ġw o"}}}}};
  return j;
}

std::unique_ptr<Tokenizer> hf(const ScratchDir& dir, const nlohmann::json& j, const std::string& sub = "hf") {
  std::filesystem::create_directories(dir / sub);
  testing::write_file(dir / (sub + "/tokenizer.json"), j.dump());
  TokenizerOptions o;
  o.type = "HuggingFaceTokenizer";
  o.tokenizer_model = dir / sub;
  return build_tokenizer(o);
}

TEST(HuggingFaceTokenizer, ByteLevelBpeWithSpecialTokens) {
  ScratchDir dir;
  auto tok = hf(dir, tiny_tokenizer_json());
  EXPECT_EQ(tok->vocab_size(), 260);
  EXPECT_EQ(tok->eod(), 259);
  EXPECT_EQ(tok->tokenize("he wo"), (std::vector<int64_t>{256, 258}));
  // Unlike GPT2BPETokenizer, a special token in the text is the token itself.
  EXPECT_EQ(tok->tokenize("he<|endoftext|> wo"), (std::vector<int64_t>{256, 259, 258}));
  EXPECT_EQ(tok->detokenize(tok->tokenize("he<|endoftext|> wo")), "he<|endoftext|> wo");
}

TEST(HuggingFaceTokenizer, PrefixSpaceTemplateAndStripping) {
  ScratchDir dir;
  auto j = tiny_tokenizer_json();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  j["model"]["merges"] = nlohmann::json::array({{"h", "e"}, {"Ġ", "w"}, {"Ġw", "o"}});  // the newer pair format
  j["added_tokens"].push_back({{"id", 260}, {"content", "[M]"}, {"single_word", false}, {"lstrip", true},
                               {"rstrip", true}, {"normalized", false}, {"special", true}});
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                         {"special_tokens", {{"<|endoftext|>", {{"id", "<|endoftext|>"}, {"ids", {259}}, {"tokens", {"<|endoftext|>"}}}}}}};
  auto tok = hf(dir, j);
  // "wo" gets a prefix space -> "Ġwo"; the template puts the special token first.
  EXPECT_EQ(tok->tokenize("wo"), (std::vector<int64_t>{259, 258}));
  // [M] swallows the spaces around it.
  EXPECT_EQ(tok->tokenize("wo  [M]  wo"), (std::vector<int64_t>{259, 258, 260, 258}));
  EXPECT_EQ(tok->vocab_size(), 261);
}

TEST(HuggingFaceTokenizer, RefusesWhatItCannotReproduce) {
  ScratchDir dir;
  auto j = tiny_tokenizer_json();
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_USER_ERROR(hf(dir, j, "a"), "normalizer NFC", "not supported");
  j = tiny_tokenizer_json();
  j["model"]["type"] = "WordPiece";
  EXPECT_USER_ERROR(hf(dir, j, "b"), "model type WordPiece");
  j = tiny_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_USER_ERROR(hf(dir, j, "c"), "pre-tokenizer Metaspace");
}

#ifdef FP8TRON_TEST_SENTENCEPIECE_TRAINER
std::string train_sentencepiece(const ScratchDir& dir) {
  std::string corpus;
  for (int i = 0; i < 400; ++i)
    corpus += "the quick brown fox " + std::to_string(i) + " jumps over the lazy dog, again and again.\n";
  testing::write_file(dir / "corpus.txt", corpus);
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + dir / "corpus.txt" + " --model_prefix=" + dir / "sp" +
      " --vocab_size=120 --model_type=bpe --minloglevel=2");
  EXPECT_TRUE(status.ok()) << status.ToString();
  return dir / "sp.model";
}

// Megatron-LM d98e8a6: all three SentencePiece types are the model's own ids, no BOS, no added
// special tokens (the legacy wrappers prepended BOS for Llama2Tokenizer and appended <CLS> <SEP>
// <EOD> <MASK> for SentencePieceTokenizer).
TEST(SentencePieceTokenizer, MegatronFlavorsAgreeOnText) {
  ScratchDir dir;
  const std::string model = train_sentencepiece(dir);
  TokenizerOptions o;
  o.tokenizer_model = model;
  o.type = "GPTSentencePieceTokenizer";
  auto gpt = build_tokenizer(o);
  o.type = "SentencePieceTokenizer";
  auto meg = build_tokenizer(o);
  o.type = "Llama2Tokenizer";
  auto llama = build_tokenizer(o);
  const std::string text = "the lazy fox jumps";
  const auto ids = gpt->tokenize(text);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(gpt->detokenize(ids), text);
  EXPECT_EQ(meg->tokenize(text), ids);
  EXPECT_EQ(llama->tokenize(text), ids);
  for (const auto* t : {gpt.get(), meg.get(), llama.get()}) {
    EXPECT_EQ(t->vocab_size(), 120);
    EXPECT_EQ(t->eod(), 2);  // the model's eos (</s>)
  }
}
#endif

std::string base64(const std::string& bytes) {
  static const char* table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int acc = 0, bits = 0;
  for (unsigned char c : bytes) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) { bits -= 6; out.push_back(table[(acc >> bits) & 63]); }
  }
  if (bits > 0) out.push_back(table[(acc << (6 - bits)) & 63]);
  while (out.size() % 4) out.push_back('=');
  return out;
}

// A tiktoken rank file: the 256 bytes, then "ab" (256), "cd" (257), "abcd" (258), "oW" (259).
std::string tiny_tiktoken_file(const ScratchDir& dir) {
  nlohmann::json list = nlohmann::json::array();
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, char(b)));
  for (const char* t : {"ab", "cd", "abcd", "oW"}) tokens.push_back(t);
  for (size_t i = 0; i < tokens.size(); ++i)
    list.push_back({{"rank", i}, {"token_bytes", base64(tokens[i])}, {"token_str", "x"}});
  testing::write_file(dir / "ranks.json", list.dump());
  return dir / "ranks.json";
}

TEST(TikTokenizer, MegatronIdsByHand) {
  if (!tiktoken_available()) GTEST_SKIP() << "built without libpcre2";
  ScratchDir dir;
  TokenizerOptions o;
  o.type = "TikTokenizer";
  o.tokenizer_model = tiny_tiktoken_file(dir);
  o.tiktoken_num_special_tokens = 8;  // the seven defaults and <SPECIAL_7>
  o.vocab_size = 8 + 260;
  auto tok = build_tokenizer(o);
  EXPECT_EQ(tok->vocab_size(), 268);
  EXPECT_EQ(tok->eod(), 2);  // </s>
  const int64_t S = 8;
  // " abcde" is one piece: a b -> ab (rank 256), c d -> cd (257), ab cd -> abcd (258); then " x".
  EXPECT_EQ(tok->tokenize("abcde</s> x"), (std::vector<int64_t>{258 + S, 'e' + S, 2, ' ' + S, 'x' + S}));
  EXPECT_EQ(tok->tokenize(" abcde"), (std::vector<int64_t>{' ' + S, 258 + S, 'e' + S}));
  // Special strings (fillers too) are their ids; "<s" without ">" is text.
  EXPECT_EQ(tok->tokenize("<SPECIAL_7><s"), (std::vector<int64_t>{7, '<' + S, 's' + S}));
  EXPECT_EQ(tok->detokenize(tok->tokenize("abcde</s> x")), "abcde</s> x");
  // v2 splits "helloWORLD" at the case change, so "oW" never merges; v1 keeps one piece.
  const std::vector<int64_t> v2_ids = tok->tokenize("helloWORLD");
  EXPECT_EQ(v2_ids.size(), 10u);
  o.tiktoken_pattern = "v1";
  const std::vector<int64_t> v1_ids = build_tokenizer(o)->tokenize("helloWORLD");
  EXPECT_EQ(v1_ids, (std::vector<int64_t>{'h' + S, 'e' + S, 'l' + S, 'l' + S, 259 + S, 'O' + S, 'R' + S, 'L' + S, 'D' + S}));
  // Digits are single pieces in both patterns.
  EXPECT_EQ(tok->tokenize("12"), (std::vector<int64_t>{'1' + S, '2' + S}));
  // The vocabulary must fit the rank file; the special list must hold the seven defaults.
  o.vocab_size = 8 + 261;
  EXPECT_USER_ERROR(build_tokenizer(o), "260 entries");
  o.vocab_size = 268;
  o.special_tokens = {"<unk>", "<s>"};
  EXPECT_USER_ERROR(build_tokenizer(o), "must include");
}

TEST(SentencePieceTokenizer, MissingModelIsAClearError) {
  TokenizerOptions o;
  o.type = "GPTSentencePieceTokenizer";
  if (sentencepiece_available()) {
    EXPECT_USER_ERROR(build_tokenizer(o), "--tokenizer-model");
    o.tokenizer_model = "/nonexistent.model";
    EXPECT_USER_ERROR(build_tokenizer(o), "/nonexistent.model");
  } else {
    EXPECT_USER_ERROR(build_tokenizer(o), "without libsentencepiece");
  }
}

}  // namespace
}  // namespace fp8tron::data
