// GPT-2 BPE golden tests on a hand-made vocabulary: every expected id below is derived by hand
// from the merge ranks (the derivations are in the comments), not produced by the code under test.
#include <gtest/gtest.h>

#include <thread>

#include <nlohmann/json.hpp>

#include "data/byte_level_bpe.h"
#include "data/gpt2_pretokenizer.h"
#include "data/tokenizer_gpt2.h"
#include "data/unicode.h"
#include "test_util.h"

namespace fp8tron::data {
namespace {

using testing::ScratchDir;

// Merges in rank order; merge r creates token id 256 + r. Ids 0..255 are the single bytes (id b
// is byte b's stand-in character), 276 is <|endoftext|>.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"Ġ", "t"},      // 0 -> 256 "Ġt"
    {"h", "e"},      // 1 -> 257 "he"
    {"Ġt", "he"},    // 2 -> 258 "Ġthe"
    {"l", "l"},      // 3 -> 259 "ll"
    {"e", "ll"},     // 4 -> 260 "ell"
    {"h", "ell"},    // 5 -> 261 "hell"
    {"hell", "o"},   // 6 -> 262 "hello"
    {"Ġ", "w"},      // 7 -> 263 "Ġw"
    {"o", "r"},      // 8 -> 264 "or"
    {"Ġw", "or"},    // 9 -> 265 "Ġwor"
    {"Ġwor", "l"},   // 10 -> 266 "Ġworl"
    {"Ġworl", "d"},  // 11 -> 267 "Ġworld"
    {"'", "s"},      // 12 -> 268 "'s"
    {"Ġ", "Ġ"},      // 13 -> 269 "ĠĠ" (two spaces)
    {"1", "2"},      // 14 -> 270 "12"
    {"Ã", "©"},      // 15 -> 271 "Ã©" (é = bytes C3 A9)
    {"a", "f"},      // 16 -> 272 "af"
    {"c", "af"},     // 17 -> 273 "caf"
    {"caf", "Ã©"},   // 18 -> 274 "café"
    {"Ċ", "Ċ"},      // 19 -> 275 "ĊĊ" (two newlines)
};

class Gpt2Golden : public ::testing::Test {
 protected:
  void SetUp() override {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) {
      std::string s;
      append_utf8(s, byte_to_unicode(uint8_t(b)));
      vocab[s] = b;
    }
    std::string merges = "#version: 0.2\n";
    for (size_t r = 0; r < kMerges.size(); ++r) {
      vocab[kMerges[r].first + kMerges[r].second] = 256 + int(r);
      merges += kMerges[r].first + " " + kMerges[r].second + "\n";
    }
    vocab["<|endoftext|>"] = 276;
    testing::write_file(dir / "vocab.json", vocab.dump());
    testing::write_file(dir / "merges.txt", merges);
    tok = std::make_unique<GPT2BPETokenizer>(dir / "vocab.json", dir / "merges.txt");
  }
  std::vector<int64_t> ids(const std::string& text) { return tok->tokenize(text); }
  ScratchDir dir;
  std::unique_ptr<GPT2BPETokenizer> tok;
};

TEST_F(Gpt2Golden, ByteStandIns) {
  EXPECT_EQ(byte_to_unicode(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_to_unicode('\t'), 0x109u);  // 'ĉ'
  EXPECT_EQ(byte_to_unicode('A'), uint32_t('A'));
  EXPECT_EQ(byte_to_unicode(0xAD), 0x143u);  // soft hyphen, the last non-printable byte
  EXPECT_EQ(byte_to_unicode(0xE9), 0xE9u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode_to_byte(byte_to_unicode(uint8_t(b))), b);
  EXPECT_EQ(tok->vocab_size(), 277);
  EXPECT_EQ(tok->eod(), 276);
}

TEST_F(Gpt2Golden, MergeRanksDecide) {
  // "hello": h e l l o. (h,e) has rank 1, lower than (l,l) 3 -> [he l l o] -> [he ll o]; "he ll"
  // is no merge, so "hello" never forms (its path needs "h ell" first).
  // " world": (Ġ,w) 7 -> (o,r) 8 -> (Ġw,or) 9 -> (Ġwor,l) 10 -> (Ġworl,d) 11 = 267.
  EXPECT_EQ(ids("hello world"), (std::vector<int64_t>{257, 259, 'o', 267}));
  // " the": (Ġ,t) 0 -> [Ġt h e] -> (h,e) 1 -> [Ġt he] -> (Ġt,he) 2 = 258.
  EXPECT_EQ(ids(" the"), std::vector<int64_t>{258});
  // "the": no (t,h) merge: [t he].
  EXPECT_EQ(ids("the"), (std::vector<int64_t>{'t', 257}));
  // "café": (Ã,©) 15 first, then (a,f) 16, (c,af) 17, (caf,Ã©) 18.
  EXPECT_EQ(ids("café"), std::vector<int64_t>{274});
  // "12345" is one number piece: (1,2) 14 -> [12 3 4 5].
  EXPECT_EQ(ids("12345"), (std::vector<int64_t>{270, '3', '4', '5'}));
}

TEST_F(Gpt2Golden, Contractions) {
  EXPECT_EQ(ids("it's"), (std::vector<int64_t>{'i', 't', 268}));  // "it" "'s"
  // Upper case is not a contraction: "IT" "'" "S".
  EXPECT_EQ(ids("IT'S"), (std::vector<int64_t>{'I', 'T', '\'', 'S'}));
  // "'ll" is a piece of its own; no merges apply inside it.
  EXPECT_EQ(ids("we'll"), (std::vector<int64_t>{'w', 'e', '\'', 259}));  // "we" "'ll" -> ' ll
}

TEST_F(Gpt2Golden, Whitespace) {
  // Two spaces before a word: the first is its own piece, the second prefixes the word.
  EXPECT_EQ(ids("a  b"), (std::vector<int64_t>{'a', ' ', ' ', 'b'}));
  // Three spaces: "  " (merged by rank 13) then " b".
  EXPECT_EQ(ids("a   b"), (std::vector<int64_t>{'a', 269, ' ', 'b'}));
  // Trailing spaces stay together.
  EXPECT_EQ(ids("a  "), (std::vector<int64_t>{'a', 269}));
  // "\n\n" before a word gives back its last "\n", which (not being ' ') stands alone.
  EXPECT_EQ(ids("x\n\ny"), (std::vector<int64_t>{'x', '\n', '\n', 'y'}));
  EXPECT_EQ(ids("x\n\n"), (std::vector<int64_t>{'x', 275}));
  EXPECT_EQ(ids("\tx"), (std::vector<int64_t>{'\t', 'x'}));
  EXPECT_EQ(ids(" \tx"), (std::vector<int64_t>{' ', '\t', 'x'}));
  // A no-break space (C2 A0) is whitespace but not ' ': its own piece, bytes 0xC2 0xA0.
  EXPECT_EQ(ids("a\u00a0b"), (std::vector<int64_t>{'a', 0xC2, 0xA0, 'b'}));
  EXPECT_EQ(ids(""), std::vector<int64_t>{});
}

TEST_F(Gpt2Golden, UnicodeLettersSymbolsAndDigits) {
  // 中 = E4 B8 AD, a letter: " 中" is one piece with its space.
  EXPECT_EQ(ids(" 中"), (std::vector<int64_t>{' ', 0xE4, 0xB8, 0xAD}));
  // 😀 = F0 9F 98 80 is neither letter nor number: a piece between "a" and "b".
  EXPECT_EQ(ids("a😀b"), (std::vector<int64_t>{'a', 0xF0, 0x9F, 0x98, 0x80, 'b'}));
  EXPECT_EQ(ids("a12"), (std::vector<int64_t>{'a', 270}));
  EXPECT_EQ(ids("Hi!!! ..."), (std::vector<int64_t>{'H', 'i', '!', '!', '!', ' ', '.', '.', '.'}));
  // The special token's text is ordinary text to the reference GPT-2 tokenizer.
  EXPECT_EQ(ids("<|endoftext|>").size(), 13u);
}

TEST_F(Gpt2Golden, PreTokenizerPieces) {
  std::vector<Piece> pieces;
  const std::string text = "Hello  world's 12 ½ café!?\n\n  end  ";
  gpt2_pretokenize(text, pieces);
  std::vector<std::string> got;
  for (const Piece& p : pieces) got.push_back(text.substr(p.begin, p.length));
  EXPECT_EQ(got, (std::vector<std::string>{"Hello", " ", " world", "'s", " 12", " ½", " café", "!?", "\n\n ", " end", "  "}));
}

TEST_F(Gpt2Golden, DetokenizeRoundTrips) {
  for (const std::string text : {"hello world", "a   b\n\n\tc", "café 中文 😀 12345", "it's  ", ""})
    EXPECT_EQ(tok->detokenize(ids(text)), text);
  // Bytes that are not valid UTF-8 decode to U+FFFD, as Python's errors="replace".
  EXPECT_EQ(tok->detokenize({0xE4, 0xB8}), "\xEF\xBF\xBD");
  EXPECT_USER_ERROR(tok->detokenize({999}), "999");
}

TEST_F(Gpt2Golden, ThreadsAgree) {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "hello world it's café " + std::to_string(i * 7919) + "\n";
  const auto expected = ids(text);
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> results(4);
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { results[size_t(t)] = tok->tokenize(text); });
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, expected);
}

// gpt2_tokenization.py reads merges with text.split('\n')[1:-1]: without a final newline the
// last merge is dropped. Symbols missing from the vocabulary become id 0.
TEST(Gpt2Quirks, MergesFileAndUnknownSymbols) {
  ScratchDir dir;
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_unicode(uint8_t(b)));
    vocab[s] = b;
  }
  vocab["<|endoftext|>"] = 256;
  testing::write_file(dir / "vocab.json", vocab.dump());
  testing::write_file(dir / "m1.txt", "#version: 0.2\nh e");  // no final newline: no merges
  EXPECT_EQ(GPT2BPETokenizer(dir / "vocab.json", dir / "m1.txt").tokenize("he"), (std::vector<int64_t>{'h', 'e'}));
  testing::write_file(dir / "m2.txt", "#version: 0.2\r\nh e\r\n");  // CRLF; "he" is not in the vocab
  EXPECT_EQ(GPT2BPETokenizer(dir / "vocab.json", dir / "m2.txt").tokenize("he"), std::vector<int64_t>{0});
}

TEST(Gpt2Quirks, ClearErrors) {
  ScratchDir dir;
  EXPECT_USER_ERROR(GPT2BPETokenizer("", ""), "--vocab-file");
  testing::write_file(dir / "v.json", "{\"a\": 0}");
  testing::write_file(dir / "m.txt", "#version\n");
  EXPECT_USER_ERROR(GPT2BPETokenizer(dir / "v.json", dir / "m.txt"), "<|endoftext|>");
  testing::write_file(dir / "bad.json", "{\"a\": ");
  EXPECT_USER_ERROR(GPT2BPETokenizer(dir / "bad.json", dir / "m.txt"), "bad.json", "not valid JSON");
  EXPECT_USER_ERROR(GPT2BPETokenizer(dir / "missing.json", dir / "m.txt"), "missing.json");
}

TEST(Unicode, ReplacementFollowsPython) {
  // Python: b"a\xe4\xb8b\xff\xf0\x9f\x98".decode("utf-8", "replace") == "a\ufffdb\ufffd\ufffd"
  EXPECT_EQ(utf8_replace_invalid("a\xe4\xb8" "b\xff\xf0\x9f\x98"), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD");
  // An encoded surrogate (ED A0 80) is three invalid bytes.
  EXPECT_EQ(utf8_replace_invalid("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
}  // namespace fp8tron::data
