#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "data/byte_level_bpe.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "data/unicode.h"
#include "test_util.h"

namespace fp8tron::data {
namespace {

using testing::ScratchDir;

class Preprocess : public ::testing::Test {
 protected:
  void SetUp() override {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) {
      std::string s;
      append_utf8(s, byte_to_unicode(uint8_t(b)));
      vocab[s] = b;
    }
    vocab["he"] = 256;
    vocab["<|endoftext|>"] = 257;
    testing::write_file(dir / "vocab.json", vocab.dump());
    testing::write_file(dir / "merges.txt", "#version: 0.2\nh e\n");
    options.input = dir / "in.jsonl";
    options.output_prefix = dir / "out";
    options.tokenizer.type = "GPT2BPETokenizer";
    options.tokenizer.vocab_file = dir / "vocab.json";
    options.tokenizer.merge_file = dir / "merges.txt";
  }
  PreprocessStats run() {
    std::ostringstream log;
    return preprocess(options, log);
  }
  ScratchDir dir;
  PreprocessOptions options;
};

TEST_F(Preprocess, DocumentsEmptyDocumentsAndEod) {
  testing::write_file(dir / "in.jsonl",
                      "{\"text\": \"he\"}\n"
                      "{\"text\": \"\"}\n"                       // empty: a boundary, no eod
                      "{\"text\": [\"he\", \"\", \"ab\"]}\n"     // sentences, the empty one dropped
                      "\n"                                        // blank line: skipped
                      "{\"text\": \"x\", \"other\": 1}\n");
  options.append_eod = true;
  const auto stats = run();
  EXPECT_EQ(stats.documents, 4);
  EXPECT_EQ(stats.blank_lines, 1);
  IndexedDataset d(preprocess_output_prefix(dir / "out", "text"));
  EXPECT_EQ(d.dtype(), DType::UInt16);
  EXPECT_EQ(d.num_documents(), 4);
  ASSERT_EQ(d.num_sequences(), 4);  // "he"+eod, "he", "ab"+eod, "x"+eod
  EXPECT_EQ(d.get(0), (std::vector<int64_t>{256, 257}));
  EXPECT_EQ(d.get(1), (std::vector<int64_t>{256}));
  EXPECT_EQ(d.get(2), (std::vector<int64_t>{'a', 'b', 257}));
  EXPECT_EQ(d.get(3), (std::vector<int64_t>{'x', 257}));
  const auto& docs = d.document_indices();
  EXPECT_EQ((std::vector<int64_t>{docs[0], docs[1], docs[2], docs[3], docs[4]}), (std::vector<int64_t>{0, 1, 1, 3, 4}));
}

TEST_F(Preprocess, OutputDoesNotDependOnWorkers) {
  std::string input;
  for (int i = 0; i < 3000; ++i)
    input += nlohmann::json({{"text", "doc " + std::to_string(i) + std::string(size_t(i % 17), 'h') + " the end"},
                             {"title", "t" + std::to_string(i % 5)}}).dump() + "\n";
  testing::write_file(dir / "in.jsonl", input);
  options.json_keys = {"text", "title"};
  options.workers = 1;
  options.output_prefix = dir / "one";
  run();
  options.workers = 4;
  options.output_prefix = dir / "four";
  const auto stats = run();
  EXPECT_EQ(stats.documents, 3000);
  for (const char* key : {"text", "title"}) {
    for (const char* ext : {".bin", ".idx"}) {
      EXPECT_EQ(testing::read_file(preprocess_output_prefix(dir / "one", key) + ext),
                testing::read_file(preprocess_output_prefix(dir / "four", key) + ext))
          << key << ext;
    }
  }
}

TEST_F(Preprocess, BadInputNamesTheLine) {
  testing::write_file(dir / "in.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"\n");
  EXPECT_USER_ERROR(run(), "in.jsonl line 2", "not valid JSON");
  testing::write_file(dir / "in.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
  EXPECT_USER_ERROR(run(), "line 2", "no key \"text\"", "--json-keys");
  testing::write_file(dir / "in.jsonl", "{\"text\": 5}\n");
  EXPECT_USER_ERROR(run(), "line 1", "not a string");
  options.input = dir / "missing.jsonl";
  EXPECT_USER_ERROR(run(), "missing.jsonl");
}

TEST_F(Preprocess, ProgressLines) {
  std::string input;
  for (int i = 0; i < 25; ++i) input += "{\"text\": \"he\"}\n";
  testing::write_file(dir / "in.jsonl", input);
  options.log_interval = 10;
  std::ostringstream log;
  preprocess(options, log);
  EXPECT_NE(log.str().find("Processed 10 documents ("), std::string::npos);
  EXPECT_NE(log.str().find("Processed 20 documents ("), std::string::npos);
  EXPECT_NE(log.str().find("MB/s)."), std::string::npos);
}

}  // namespace
}  // namespace fp8tron::data
