#include "trainer/cli/checkpoint_args.h"

#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/megatron/saved_arguments.h"
#include "checkpoint/metadata.h"

namespace fp8tron {

namespace {

// Megatron's _set_arg('padded_vocab_size'): the model keeps the checkpoint's padded vocabulary
// unless --padded-vocab-size is given, or this run's tensor-parallel size cannot split it (then
// this run pads its own and the load trims or pads the rows past the vocabulary).
void carry_padded_vocab(FlagValues& flags, const std::map<std::string, std::string>& args) {
  auto it = args.find("model.padded_vocab_size");
  if (flags.given("padded-vocab-size") || it == args.end()) return;
  int64_t padded = 0;
  try {
    padded = std::stoll(it->second);
  } catch (const std::exception&) {
    return;
  }
  const int64_t tp = flags.get_int("tensor-model-parallel-size");
  if (padded <= 0 || tp <= 0) return;
  if (padded % tp != 0) {
    log::info(strprintf(" > the checkpoint's padded vocabulary (%lld rows) does not split over "
                        "--tensor-model-parallel-size %lld: this run pads its own, and the rows past the vocabulary are "
                        "trimmed or padded on load",
                        (long long)padded, (long long)tp));
    return;
  }
  log::print("Setting padded_vocab_size to " + it->second + " from checkpoint");
  flags.set("padded-vocab-size", {it->second});
}

// Megatron's _set_arg(name, force=True): `name` takes the checkpoint's `value`, logged as Megatron
// logs it, unless this run has that value already. A value saved unset ("None") leaves this run's.
void set_from_checkpoint(FlagValues& flags, const std::string& name, const std::string& value) {
  const FlagSpec* spec = find_flag(name);
  FP8TRON_CHECK(spec != nullptr, "not a flag: " + name);
  if (spec->kind == FlagKind::Bool) {
    if (value != "true" && value != "false") return;
    if (flags.get_bool(name) == (value == "true")) return;
  } else {
    if (value == "None") return;
    if (flags.given(name) ? flags.get_list(name) == std::vector<std::string>{value}
                          : *spec->default_value && value == spec->default_value)
      return;
  }
  std::string key = name;
  for (char& c : key) c = c == '-' ? '_' : c;
  log::print("Setting " + key + " to " + value + " from checkpoint");
  flags.set(name, {value});
}

// Megatron's --use-mp-args-from-checkpoint-args: the saved run's tensor-, pipeline- and
// expert-parallel sizes replace this run's; its virtual pipeline is taken only when this run asks
// for none (Megatron forces the saved virtual size, but its argument checks then derive it again
// from this run's --num-layers-per-virtual-pipeline-stage).
void take_parallel_layout(FlagValues& flags, const std::map<std::string, std::string>& saved) {
  for (const char* name : {"tensor-model-parallel-size", "pipeline-model-parallel-size", "expert-model-parallel-size"}) {
    auto it = saved.find(name);
    if (it != saved.end()) set_from_checkpoint(flags, name, it->second);
  }
  if (flags.given("num-layers-per-virtual-pipeline-stage") || flags.given("num-virtual-stages-per-pipeline-rank")) return;
  auto layers_per_stage = saved.find("num-layers-per-virtual-pipeline-stage");
  // Megatron's virtual_pipeline_model_parallel_size is fp8tron's --num-virtual-stages-per-pipeline-rank.
  auto virtual_stages = saved.find("virtual-pipeline-model-parallel-size");
  if (virtual_stages == saved.end()) virtual_stages = saved.find("num-virtual-stages-per-pipeline-rank");
  if (layers_per_stage != saved.end() && layers_per_stage->second != "None")
    set_from_checkpoint(flags, "num-layers-per-virtual-pipeline-stage", layers_per_stage->second);
  else if (virtual_stages != saved.end())
    set_from_checkpoint(flags, "num-virtual-stages-per-pipeline-rank", virtual_stages->second);
}

// The arguments of a checkpoint Megatron-LM wrote, under fp8tron's metadata keys: flag names
// ("num-layers"), --disable-bias-linear from Megatron's inverted add_bias_linear, and
// model.padded_vocab_size.
std::map<std::string, std::string> megatron_flag_values(const std::map<std::string, std::string>& saved) {
  std::map<std::string, std::string> out;
  for (const auto& [name, value] : saved) {
    std::string flag = name;
    for (char& c : flag) c = c == '_' ? '-' : c;
    out[flag] = value;
  }
  auto bias = saved.find("add_bias_linear");
  if (bias != saved.end() && (bias->second == "true" || bias->second == "false"))
    out["disable-bias-linear"] = bias->second == "true" ? "false" : "true";
  auto padded = saved.find("padded_vocab_size");
  if (padded != saved.end()) out["model.padded_vocab_size"] = padded->second;
  return out;
}

// The saved arguments of the checkpoint in `dir`: fp8tron's metadata, or Megatron's namespace.
std::map<std::string, std::string> saved_flag_values(const std::string& dir) {
  if (auto megatron = checkpoint::megatron::saved_arguments(dir)) return megatron_flag_values(*megatron);
  return checkpoint::read_metadata(dir).args;
}

}  // namespace

void apply_checkpoint_args(FlagValues& flags) {
  if (!flags.get_bool("use-checkpoint-args")) {
    if (flags.get_bool("use-mp-args-from-checkpoint-args"))
      log::warning("--use-mp-args-from-checkpoint-args does nothing without --use-checkpoint-args (as in Megatron): "
                   "the parallel layout stays this run's");
    return;
  }
  // From --load's checkpoint, or (a fine-tuning run's start) from --pretrained-checkpoint's while
  // --load holds none: Megatron takes the pretrained checkpoint's, then --load's over them.
  std::string load = flags.get_string("load");
  const std::string pretrained = flags.get_string("pretrained-checkpoint");
  if (!pretrained.empty() && (load.empty() || !checkpoint::read_tracker(load))) load = pretrained;
  if (load.empty()) throw UserError("--use-checkpoint-args needs --load or --pretrained-checkpoint");
  const auto step = flags.opt_int("ckpt-step");
  if (!step && !checkpoint::read_tracker(load))
    throw UserError("--use-checkpoint-args: no checkpoint in " + load + " to take the arguments from (" + load + "/" +
                    checkpoint::kTrackerFileName + " is missing)");
  const checkpoint::CheckpointLocation location =
      step ? checkpoint::locate_checkpoint(load, *step) : checkpoint::locate_latest_checkpoint(load);
  const std::map<std::string, std::string> saved = saved_flag_values(location.path);
  // What Megatron forces from the checkpoint (those fp8tron has).
  static const char* const kModelFlags[] = {
      "num-layers", "hidden-size", "ffn-hidden-size", "seq-length", "num-attention-heads", "group-query-attention",
      "num-query-groups", "kv-channels", "max-position-embeddings", "position-embedding-type", "rotary-base",
      "rotary-percent", "disable-bias-linear", "add-qkv-bias", "swiglu", "untie-embeddings-and-output-weights",
      "apply-layernorm-1p", "normalization", "norm-epsilon", "qk-layernorm", "attention-dropout", "hidden-dropout",
      "tokenizer-type", "vocab-size", "make-vocab-size-divisible-by", "init-method-std", "transformer-impl",
      // model variants
      "squared-relu", "rotary-interleaved", "use-rope-scaling", "rope-scaling-factor", "rotary-scaling-factor", "mscale",
      "mscale-all-dim", "multi-latent-attention", "q-lora-rank", "kv-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim",
      "v-head-dim", "rope-type", "mtp-num-layers",
      // mixture of experts
      "num-experts", "moe-layer-freq", "moe-ffn-hidden-size", "moe-router-topk", "moe-router-pre-softmax",
      "moe-grouped-gemm", "moe-shared-expert-intermediate-size", "moe-router-score-function",
      "moe-router-enable-expert-bias", "moe-router-topk-scaling-factor"};
  std::vector<const char*> names(std::begin(kModelFlags), std::end(kModelFlags));
  // Megatron also takes the tokenizer model unless told not to.
  if (!flags.get_bool("no-use-tokenizer-model-from-checkpoint-args") &&
      !flags.get_bool("disable-use-tokenizer-model-from-checkpoint-args"))
    names.push_back("tokenizer-model");
  for (const char* name : names) {
    auto it = saved.find(name);
    if (it != saved.end()) set_from_checkpoint(flags, name, it->second);
  }
  if (flags.get_bool("use-mp-args-from-checkpoint-args")) take_parallel_layout(flags, saved);
  carry_padded_vocab(flags, saved);
}

}  // namespace fp8tron
