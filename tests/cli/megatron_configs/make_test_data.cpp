// Test data for the Megatron-config dry runs (tests/cli/megatron_configs_test.sh), written into OUTDIR:
//   vocab.json, merges.txt  a synthetic GPT-2-format BPE vocabulary of exactly GPT-2's size (50257:
//                           256 byte symbols, 50000 merges, <|endoftext|> = 50256), so padded
//                           vocabulary sizes are the ones Megatron computes for its test configs
//   corpus.jsonl            a few hundred short documents of lowercase words
//   sp.model                a 1000-piece SentencePiece model, when the SentencePiece trainer is
//                           linked (the configs with --tokenizer-model need it; others do not)
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "data/byte_level_bpe.h"
#include "data/unicode.h"

#ifdef FP8TRON_TEST_SENTENCEPIECE_TRAINER
#include <sentencepiece_trainer.h>
#endif

namespace {
using fp8tron::data::append_utf8;
using fp8tron::data::byte_to_unicode;

std::string symbol(int byte) {
  std::string s;
  append_utf8(s, byte_to_unicode(uint8_t(byte)));
  return s;
}

void write_vocabulary(const std::string& dir) {
  std::vector<std::string> symbols;
  for (int b = 0; b < 256; ++b) symbols.push_back(symbol(b));
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[symbols[size_t(b)]] = b;
  // 50000 merges of two base symbols, lowercase letters first so that the corpus uses them.
  std::vector<std::string> order;
  for (int b = 0; b < 256; ++b)
    if (b >= 'a' && b <= 'z') order.push_back(symbols[size_t(b)]);
  for (int b = 0; b < 256; ++b)
    if (!(b >= 'a' && b <= 'z')) order.push_back(symbols[size_t(b)]);
  std::ofstream merges(dir + "/merges.txt");
  merges << "#version: 0.2\n";
  int n = 0;
  for (const auto& a : order) {
    for (const auto& b : order) {
      if (n == 50000) break;
      merges << a << " " << b << "\n";
      vocab[a + b] = 256 + n++;
    }
  }
  vocab["<|endoftext|>"] = 50256;
  std::ofstream(dir + "/vocab.json") << vocab.dump();
}

void write_corpus(const std::string& dir) {
  std::mt19937 rng(1234);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::string> words;
  for (int i = 0; i < 500; ++i) {
    std::string w;
    for (int k = uniform(2, 9); k > 0; --k) w += char('a' + uniform(0, 25));
    words.push_back(w);
  }
  std::ofstream out(dir + "/corpus.jsonl");
  std::ofstream text(dir + "/corpus.txt");
  for (int d = 0; d < 400; ++d) {
    std::string doc;
    for (int k = uniform(50, 400); k > 0; --k) doc += (doc.empty() ? "" : " ") + words[size_t(uniform(0, 499))];
    out << nlohmann::json{{"text", doc}}.dump() << "\n";
    text << doc << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_test_data OUTDIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  write_vocabulary(dir);
  write_corpus(dir);
#ifdef FP8TRON_TEST_SENTENCEPIECE_TRAINER
  const auto status = sentencepiece::SentencePieceTrainer::Train("--input=" + dir + "/corpus.txt --model_prefix=" + dir +
                                                                 "/sp --vocab_size=1000 --model_type=bpe --byte_fallback=true "
                                                                 "--character_coverage=1.0 --minloglevel=2");
  if (!status.ok()) {
    std::fprintf(stderr, "SentencePiece training failed: %s\n", status.ToString().c_str());
    return 1;
  }
#endif
  return 0;
}
