// Megatron's fill-in-the-middle rewrite of one sample (GPTFIMDataset in
// megatron/training/datasets/fim_dataset.py), draw for draw:
//
//   1. The sample is cut at every end-of-document token (--fim-eod-token); each non-empty segment
//      is rewritten and followed by the end-of-document token again, and the segment after the
//      last one (or the whole sample when there is none) is rewritten too, even when empty.
//   2. With --fim-split-sample, a segment holding that token is instead, with probability
//      --fim-rate, cut at it into fragments, each rewritten with probability --fim-fragment-rate
//      and followed by the split token again (an empty fragment before a split token is skipped;
//      the one after the last is not).
//   3. Rewriting a piece: with probability `rate` it is detokenized without special tokens into
//      text; text starting with --fim-no-prefix is left as it was; otherwise two character
//      positions cut the text into prefix, middle and suffix, each tokenized again, and with
//      probability --fim-spm-rate the piece becomes SPM, else PSM:
//         PSM: <prefix> prefix <suffix> suffix <middle> middle
//         SPM: <prefix> <suffix> suffix <middle> prefix middle
//   4. The rewritten sample is cut back to its length, or filled up with --fim-pad-token.
//
// Characters are Unicode code points of the decoded text (Python str positions); invalid UTF-8
// decodes to U+FFFD first. The draws are numpy.random.RandomState's binomial(1, p) and
// randint(0, len + 1, size=2), in Megatron's order.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/numpy_random.h"
#include "data/tokenizer.h"

namespace fp8tron::data {

// The special tokens of the rewrite, as ids of the run's tokenizer (fim_tokens.h finds them).
struct FimTokenIds {
  int64_t prefix = -1, middle = -1, suffix = -1, pad = -1, eod = -1;
  std::optional<int64_t> split_sample;  // --fim-split-sample
};

struct FimOptions {
  double rate = 0.5;                    // --fim-rate
  double spm_rate = 0.5;                // --fim-spm-rate
  std::optional<double> fragment_rate;  // --fim-fragment-rate (needed with a split token)
  std::optional<std::string> no_prefix;  // --fim-no-prefix
  FimTokenIds tokens;
};

// The rewritten sample, exactly sample.size() tokens long.
std::vector<int64_t> fill_in_the_middle(std::span<const int64_t> sample, const FimOptions& options,
                                        const Tokenizer& tokenizer, NumpyRandomState& rng);

}  // namespace fp8tron::data
