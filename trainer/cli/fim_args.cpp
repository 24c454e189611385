#include "trainer/cli/fim_args.h"

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {

const char* const kFimFlags[] = {"fim-rate",         "fim-spm-rate",      "fim-split-sample",  "fim-fragment-rate",
                                 "fim-no-prefix",    "fim-prefix-token",  "fim-middle-token",  "fim-suffix-token",
                                 "fim-pad-token",    "fim-eod-token"};

double probability(const FlagValues& f, const std::string& name) {
  const double p = f.get_float(name);
  if (!(p >= 0.0 && p <= 1.0))
    throw UserError(strprintf("--%s %g is not a probability: give a value from 0 to 1", name.c_str(), p));
  return p;
}

}  // namespace

FimConfig build_fim_config(const FlagValues& f, std::vector<std::string>& warnings) {
  FimConfig c;
  c.enabled = f.get_bool("fim-data");
  if (!c.enabled) {
    std::vector<std::string> given;
    for (const char* name : kFimFlags)
      if (f.given(name)) given.push_back(std::string("--") + name);
    if (!given.empty())
      warnings.push_back(join(given, ", ") + (given.size() == 1 ? " has" : " have") +
                         " no effect without --fim-data (as in Megatron)");
    return c;
  }
  c.rate = probability(f, "fim-rate");
  c.spm_rate = probability(f, "fim-spm-rate");
  // Megatron treats an empty split token as none, and compares any given prefix (even an empty one).
  if (auto split = f.opt_string("fim-split-sample"); split && !split->empty()) c.split_sample = *split;
  if (f.opt_float("fim-fragment-rate")) c.fragment_rate = probability(f, "fim-fragment-rate");
  if (f.given("fim-no-prefix")) c.no_prefix = f.get_string("fim-no-prefix");
  if (c.split_sample && !c.fragment_rate)
    throw UserError("--fim-split-sample needs --fim-fragment-rate (the probability that each fragment is rewritten; "
                    "Megatron's dataset fails without it)");
  c.prefix_token = f.get_string("fim-prefix-token");
  c.middle_token = f.get_string("fim-middle-token");
  c.suffix_token = f.get_string("fim-suffix-token");
  c.pad_token = f.get_string("fim-pad-token");
  c.eod_token = f.get_string("fim-eod-token");
  return c;
}

std::string fim_data_problem(const DataConfig& d) {
  if (!d.fim.enabled) return "";
  if (d.source == DataSource::Mock) return "--fim-data does not work with --mock-data (as in Megatron): pass --data-path";
  if (d.source == DataSource::Builtin)
    return "--fim-data needs Megatron indexed datasets and their tokenizer: pass --data-path instead of --builtin-data";
  if (d.tokenizer_type != "GPT2BPETokenizer" && d.tokenizer_type != "HuggingFaceTokenizer" &&
      d.tokenizer_type != "TikTokenizer")
    return "--fim-data needs a tokenizer that turns tokens back into text and looks its special tokens up: "
           "GPT2BPETokenizer, HuggingFaceTokenizer or TikTokenizer (Megatron's FIM dataset fails with " +
           d.tokenizer_type + " too)";
  return "";
}

}  // namespace fp8tron
