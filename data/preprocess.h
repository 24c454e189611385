// The engine of fp8tron-preprocess (Megatron's tools/preprocess_data.py): JSONL in, one indexed
// dataset per JSON key out (<prefix>_<key>_document.bin/.idx), byte-identical to Megatron's.
//
// A reader hands batches of lines to --workers tokenizer threads; a writer appends their results
// to the datasets in input order, so the output does not depend on the number of workers.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace fp8tron::data {

struct PreprocessOptions {
  std::string input;                            // --input (JSONL)
  std::vector<std::string> json_keys{"text"};   // --json-keys
  std::string output_prefix;                    // --output-prefix
  TokenizerOptions tokenizer;                   // --tokenizer-type and its files
  bool append_eod = false;                      // --append-eod
  int workers = 1;                              // --workers
  int64_t log_interval = 1000;                  // --log-interval (documents)
};

struct PreprocessStats {
  int64_t documents = 0;
  int64_t bytes = 0;          // of JSONL read
  int64_t blank_lines = 0;    // skipped
  std::vector<int64_t> tokens;  // per key
  double seconds = 0;
};

// Output files for one key: <prefix>_<key>_document (+ .bin/.idx).
std::string preprocess_output_prefix(const std::string& prefix, const std::string& key);

// Runs the whole conversion; progress lines go to `log` every log_interval documents.
PreprocessStats preprocess(const PreprocessOptions& options, std::ostream& log);

}  // namespace fp8tron::data
