// fp8tron-preprocess: tokenizes a JSONL file into Megatron indexed datasets. Takes the flags of
// Megatron-LM's tools/preprocess_data.py, e.g.
//   fp8tron-preprocess --input corpus.jsonl --output-prefix data/corpus --tokenizer-type GPT2BPETokenizer
//       --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --append-eod --workers 8
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/text.h"
#include "data/preprocess.h"

namespace {

using fp8tron::UserError;
using fp8tron::strprintf;
using fp8tron::data::PreprocessOptions;

constexpr const char* kUsage = R"(usage: fp8tron-preprocess --input FILE.jsonl --output-prefix PREFIX --tokenizer-type TYPE
                          [--json-keys KEY [KEY ...]] [--vocab-file FILE] [--merge-file FILE]
                          [--tokenizer-model PATH] [--vocab-size N] [--append-eod]
                          [--workers N] [--log-interval N]

Writes PREFIX_<key>_document.bin/.idx for each JSON key (default: text), byte-identical to
Megatron-LM's tools/preprocess_data.py.
  --tokenizer-type   GPT2BPETokenizer (--vocab-file, --merge-file), HuggingFaceTokenizer
                     (--tokenizer-model: tokenizer.json or its directory), SentencePieceTokenizer,
                     GPTSentencePieceTokenizer, Llama2Tokenizer (--tokenizer-model), NullTokenizer
                     (--vocab-size)
  --append-eod       end every non-empty document with the end-of-document token
  --workers          tokenizer threads (default 1)
  --log-interval     documents between progress lines (default 1000)
)";

// Flags of preprocess_data.py that fp8tron accepts but that change nothing here.
const std::vector<std::string> kIgnored = {"--keep-sequential-samples"};
// Flags it has that fp8tron does not implement.
const std::map<std::string, std::string> kUnsupported = {
    {"--split-sentences", "sentence splitting needs NLTK's punkt models"},
    {"--keep-newlines", "it only applies with --split-sentences"},
    {"--find-optimal-num-workers", "run with a few --workers values instead"},
};

int64_t parse_int(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0') throw UserError(strprintf("%s expects an integer, got '%s'", flag.c_str(), value.c_str()));
  return v;
}

PreprocessOptions parse_args(const std::vector<std::string>& args) {
  PreprocessOptions o;
  const std::vector<std::string> known = {"--input", "--json-keys", "--output-prefix", "--tokenizer-type", "--vocab-file",
                                          "--merge-file", "--tokenizer-model", "--vocab-size", "--append-eod", "--workers",
                                          "--log-interval", "--partitions", "--lang", "--help"};
  bool have_type = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    bool inline_value = false;
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      inline_value = true;
    }
    const auto next = [&]() -> std::string {
      if (inline_value) return value;
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) throw UserError(flag + " expects a value");
      return args[++i];
    };
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (flag == "--input") { o.input = next();
    } else if (flag == "--output-prefix") { o.output_prefix = next();
    } else if (flag == "--tokenizer-type") { o.tokenizer.type = next(); have_type = true;
    } else if (flag == "--vocab-file") { o.tokenizer.vocab_file = next();
    } else if (flag == "--merge-file") { o.tokenizer.merge_file = next();
    } else if (flag == "--tokenizer-model") { o.tokenizer.tokenizer_model = next();
    } else if (flag == "--vocab-size") { o.tokenizer.vocab_size = parse_int(flag, next());
    } else if (flag == "--workers") { o.workers = int(parse_int(flag, next()));
    } else if (flag == "--log-interval") { o.log_interval = parse_int(flag, next());
    } else if (flag == "--lang") { next();  // only used for sentence splitting
    } else if (flag == "--append-eod") { o.append_eod = true;
    } else if (flag == "--partitions") {
      if (parse_int(flag, next()) != 1)
        throw UserError("--partitions other than 1 is not supported: fp8tron-preprocess scales with --workers alone");
    } else if (flag == "--json-keys") {
      o.json_keys.clear();
      if (inline_value) o.json_keys.push_back(value);
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) o.json_keys.push_back(args[++i]);
      if (o.json_keys.empty()) throw UserError("--json-keys expects at least one key");
    } else if (kUnsupported.count(flag)) {
      throw UserError(strprintf("%s is not supported by fp8tron-preprocess: %s", flag.c_str(), kUnsupported.at(flag).c_str()));
    } else if (std::find(kIgnored.begin(), kIgnored.end(), flag) != kIgnored.end()) {
      // accepted for compatibility
    } else {
      const std::string hint = fp8tron::closest_match(flag, known);
      throw UserError(strprintf("unknown argument %s%s (see --help)", flag.c_str(),
                                hint.empty() ? "" : (", did you mean " + hint + "?").c_str()));
    }
  }
  if (!have_type) throw UserError("--tokenizer-type is required (see --help)");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const PreprocessOptions options = parse_args(std::vector<std::string>(argv + 1, argv + argc));
    const auto stats = fp8tron::data::preprocess(options, std::cerr);
    for (size_t k = 0; k < options.json_keys.size(); ++k)
      std::cout << strprintf("wrote %s.{bin,idx}: %lld documents, %lld tokens\n",
                             fp8tron::data::preprocess_output_prefix(options.output_prefix, options.json_keys[k]).c_str(),
                             (long long)stats.documents, (long long)stats.tokens[k]);
    std::cout << strprintf("%.2f MB of JSONL in %.2f s (%.2f MB/s, %d worker%s)%s\n", stats.bytes / 1048576.0,
                           stats.seconds, stats.bytes / 1048576.0 / std::max(stats.seconds, 1e-9), options.workers,
                           options.workers == 1 ? "" : "s",
                           stats.blank_lines ? strprintf("; skipped %lld blank lines", (long long)stats.blank_lines).c_str() : "");
    return 0;
  } catch (const UserError& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
