#include "trainer/cli/config_builder.h"

#include <algorithm>
#include <cmath>
#include <csignal>

#include "core/error.h"
#include "core/text.h"
#include "fp8/recipe.h"
#include "trainer/checkpoint/fault_points.h"
#include "trainer/cli/context_parallel_args.h"
#include "trainer/cli/moe_args.h"
#include "trainer/cli/recompute_args.h"
#include "trainer/cli/tp_overlap_args.h"

namespace fp8tron {
namespace {

// Collects what the given flags' support level asks for: NotYet and Unsupported are recorded or
// thrown, HintOnly becomes a warning line. A NotYet flag counts only when it differs from default.
void classify_given_flags(const FlagValues& flags, Config& c) {
  for (const auto& [name, values] : flags.all_given()) {
    const FlagSpec* spec = find_flag(name);
    const std::string flag = "--" + name;
    switch (spec->support) {
      case Support::Yes:
        break;
      case Support::NotYet: {
        bool is_default = spec->kind != FlagKind::Bool && values.size() == 1 && *spec->default_value &&
                          values[0] == spec->default_value;
        if (!is_default) c.not_supported_yet.push_back(flag + " (" + spec->note + ")");
        break;
      }
      case Support::HintOnly:
        c.hint_warnings.push_back(flag + " is accepted but has no effect in fp8tron: " + spec->note);
        break;
      case Support::Unsupported:
        throw UserError(flag + " is not supported by fp8tron: " + spec->note);
    }
  }
}

ModelConfig build_model(const FlagValues& f, int tp, int64_t vocab_size) {
  ModelConfig m;
  m.num_layers = f.get_int("num-layers");
  m.hidden_size = f.get_int("hidden-size");
  m.num_attention_heads = f.get_int("num-attention-heads");
  if (m.num_layers <= 0) throw UserError("--num-layers must be positive");
  if (m.hidden_size <= 0) throw UserError("--hidden-size must be positive");
  if (m.num_attention_heads <= 0) throw UserError("--num-attention-heads must be positive");
  m.swiglu = f.get_bool("swiglu");
  if (auto ffn = f.opt_int("ffn-hidden-size")) {
    m.ffn_hidden_size = *ffn;
  } else {
    // Megatron: 4h, or with SwiGLU 2/3 of 4h rounded down to a multiple of 64 (same parameters).
    m.ffn_hidden_size = m.swiglu ? int64_t((4 * m.hidden_size * 2 / 3) / 64) * 64 : 4 * m.hidden_size;
  }
  if (auto kv = f.opt_int("kv-channels")) {
    m.kv_channels = *kv;
  } else {
    if (m.hidden_size % m.num_attention_heads != 0)
      throw UserError(strprintf("--hidden-size (%lld) is not divisible by --num-attention-heads (%lld); set --kv-channels",
                                (long long)m.hidden_size, (long long)m.num_attention_heads));
    m.kv_channels = m.hidden_size / m.num_attention_heads;
  }
  m.num_query_groups = f.get_bool("group-query-attention") ? f.get_int("num-query-groups") : m.num_attention_heads;
  m.seq_length = f.get_int("seq-length");
  m.max_position_embeddings = f.opt_int("max-position-embeddings").value_or(m.seq_length);
  m.position_embedding = f.get_string("position-embedding-type") == "rope" ? PositionEmbedding::Rope
                                                                           : PositionEmbedding::LearnedAbsolute;
  m.rotary_base = double(f.get_int("rotary-base"));
  m.rotary_percent = f.get_float("rotary-percent");
  m.normalization = f.get_string("normalization") == "RMSNorm" ? Normalization::RMSNorm : Normalization::LayerNorm;
  m.norm_epsilon = f.get_float("norm-epsilon");
  m.apply_layernorm_1p = f.get_bool("apply-layernorm-1p");
  m.add_bias_linear = !f.get_bool("disable-bias-linear");
  m.add_qkv_bias = m.add_bias_linear || f.get_bool("add-qkv-bias");
  m.untie_embeddings_and_output_weights = f.get_bool("untie-embeddings-and-output-weights");
  m.init_method_std = f.get_float("init-method-std");
  m.attention_dropout = f.get_float("attention-dropout");
  m.hidden_dropout = f.get_float("hidden-dropout");
  m.qk_layernorm = f.get_bool("qk-layernorm");
  m.attention_softmax_in_fp32 = f.get_bool("attention-softmax-in-fp32");
  m.transformer_engine_modules = f.get_string("transformer-impl") == "transformer_engine";
  m.vocab_size = vocab_size;
  const int64_t divisible_by = f.get_int("make-vocab-size-divisible-by");
  if (divisible_by <= 0) throw UserError("--make-vocab-size-divisible-by must be positive");
  m.padded_vocab_size = padded_vocab_size(m.vocab_size, divisible_by, tp);
  if (const auto padded = f.opt_int("padded-vocab-size")) {
    // Megatron: given, it is the model's vocabulary as is (--use-checkpoint-args takes the checkpoint's).
    if (*padded < m.vocab_size)
      throw UserError(strprintf("--padded-vocab-size (%lld) is smaller than the tokenizer's vocabulary (%lld)",
                                (long long)*padded, (long long)m.vocab_size));
    if (*padded % tp != 0)
      throw UserError(strprintf("--padded-vocab-size (%lld) is not divisible by --tensor-model-parallel-size (%d): drop "
                                "it to pad to a multiple of --make-vocab-size-divisible-by x %d (%lld)",
                                (long long)*padded, tp, tp, (long long)m.padded_vocab_size));
    m.padded_vocab_size = *padded;
  }
  m.seed = uint64_t(f.get_int("seed"));
  return m;
}

PrecisionConfig build_precision(const FlagValues& f) {
  PrecisionConfig p;
  const bool bf16 = f.get_bool("bf16"), fp16 = f.get_bool("fp16");
  if (bf16 && fp16) throw UserError("--bf16 and --fp16 cannot be used together; choose one");
  p.params_dtype = bf16 ? ParamDtype::Bf16 : fp16 ? ParamDtype::Fp16 : ParamDtype::Fp32;
  // Megatron forces fp32 gradient accumulation and reduction for bf16.
  p.gradient_accumulation_fusion = !f.get_bool("no-gradient-accumulation-fusion");
  p.grads_in_fp32 = p.params_dtype == ParamDtype::Fp32 || bf16 || f.get_bool("accumulate-allreduce-grads-in-fp32");
  p.static_loss_scale = f.opt_float("loss-scale");
  p.initial_loss_scale = f.get_float("initial-loss-scale");
  p.min_loss_scale = f.get_float("min-loss-scale");
  p.loss_scale_window = int64_t(f.get_float("loss-scale-window"));
  p.hysteresis = int(f.get_int("hysteresis"));
  return p;
}

// --fp8-format turns FP8 on (Megatron: no format, no FP8); the other --fp8-* flags shape the recipe.
Fp8Config build_fp8(const FlagValues& f, const ModelConfig& m, const PrecisionConfig& p, bool gpu) {
  Fp8Config c;
  const std::string format = f.get_string("fp8-format");
  if (format.empty()) {
    if (f.get_bool("fp8-param-gather"))
      throw UserError("--fp8-param-gather keeps the FP8 linears' weights in FP8: it needs --fp8-format");
    return c;
  }
  if (!m.transformer_engine_modules)
    throw UserError("--fp8-format needs --transformer-impl transformer_engine (the local modules are plain bf16)");
  if (gpu && p.params_dtype != ParamDtype::Bf16)
    throw UserError("--fp8-format needs --bf16 on the GPU (the FP8 kernels read bf16 activations)");
  c.recipe = fp8::make_recipe(fp8::parse_recipe_kind(f.get_string("fp8-recipe")), fp8::parse_fp8_format(format),
                              int(f.get_int("fp8-margin")), int(f.get_int("fp8-interval")),
                              int(f.get_int("fp8-amax-history-len")),
                              fp8::parse_amax_compute_algo(f.get_string("fp8-amax-compute-algo")));
  c.tp_only_amax_reduction = f.get_bool("tp-only-amax-red");
  if (f.get_bool("first-last-layers-bf16")) {
    c.bf16_first_layers = f.get_int("num-layers-at-start-in-bf16");
    c.bf16_last_layers = f.get_int("num-layers-at-end-in-bf16");
    if (c.bf16_first_layers < 0 || c.bf16_last_layers < 0)
      throw UserError("--num-layers-at-start-in-bf16 and --num-layers-at-end-in-bf16 must be >= 0");
    if (c.bf16_first_layers + c.bf16_last_layers > m.num_layers)
      throw UserError(strprintf("--num-layers-at-start-in-bf16 (%lld) + --num-layers-at-end-in-bf16 (%lld) exceed "
                                "--num-layers (%lld)",
                                (long long)c.bf16_first_layers, (long long)c.bf16_last_layers, (long long)m.num_layers));
  }
  c.min_features = f.get_int("fp8-min-features");
  c.grouped_gemm_fp8 = !f.get_bool("no-use-gmm-fp8");
  c.param_gather = f.get_bool("fp8-param-gather");
  if (c.min_features < 0) throw UserError("--fp8-min-features must be >= 0");
  return c;
}

// Megatron's loss and gradient checks; `warnings` gets Megatron's notice when fp16's dynamic loss
// scale turns the NaN check off.
NumericsChecks build_numerics(const FlagValues& f, const PrecisionConfig& p, std::vector<std::string>& warnings) {
  NumericsChecks n;
  if (f.get_bool("check-for-nan-in-loss-and-grad") && f.get_bool("no-check-for-nan-in-loss-and-grad"))
    throw UserError("--check-for-nan-in-loss-and-grad and --no-check-for-nan-in-loss-and-grad contradict each other; give one");
  n.nan_in_loss_and_grad = !f.get_bool("no-check-for-nan-in-loss-and-grad");
  if (n.nan_in_loss_and_grad && p.params_dtype == ParamDtype::Fp16 && !p.static_loss_scale) {
    // Megatron: overflows are the dynamic loss scaler's signal, skipped and counted.
    n.nan_in_loss_and_grad = false;
    warnings.push_back("Setting args.check_for_nan_in_loss_and_grad to False since dynamic loss scaling is being used");
  }
  n.spiky_loss = f.get_bool("check-for-spiky-loss");
  n.large_grads = f.get_bool("check-for-large-grads");
  if (const std::string spec = f.get_string("fp8tron-test-inject-nan"); !spec.empty()) {
    const size_t colon = spec.find(':');
    int64_t iteration = 0;
    try {
      size_t used = 0;
      iteration = std::stoll(spec.substr(0, colon), &used);
      if (used != spec.substr(0, colon).size()) iteration = 0;
    } catch (const std::exception&) {
    }
    if (iteration <= 0) throw UserError("--fp8tron-test-inject-nan " + spec + ": expected ITER[:PARAM] with ITER >= 1");
    n.test_nan_iteration = iteration;
    if (colon != std::string::npos) n.test_nan_param = spec.substr(colon + 1);
  }
  return n;
}

TrainingConfig build_training(const FlagValues& f, int dp) {
  TrainingConfig t;
  t.micro_batch_size = f.get_int("micro-batch-size");
  if (t.micro_batch_size <= 0) throw UserError("--micro-batch-size must be positive");
  t.global_batch_size = f.opt_int("global-batch-size").value_or(t.micro_batch_size * dp);
  if (t.global_batch_size <= 0) throw UserError("--global-batch-size must be positive");
  if (t.global_batch_size % (t.micro_batch_size * dp) != 0)
    throw UserError(strprintf("--global-batch-size (%lld) is not divisible by --micro-batch-size (%lld) x "
                              "data-parallel size (%d)",
                              (long long)t.global_batch_size, (long long)t.micro_batch_size, dp));
  t.num_micro_batches = t.global_batch_size / (t.micro_batch_size * dp);
  const auto iters = f.opt_int("train-iters");
  const auto samples = f.opt_int("train-samples");
  if (iters && samples) throw UserError("--train-iters and --train-samples cannot be used together; choose one");
  if (!iters && !samples) throw UserError("either --train-iters or --train-samples is required");
  if (iters) {
    if (*iters <= 0) throw UserError("--train-iters must be positive");
    t.train_iters = *iters;
  } else {
    if (*samples < t.global_batch_size)
      throw UserError("--train-samples is smaller than one --global-batch-size");
    t.train_samples = samples;
    t.train_iters = *samples / t.global_batch_size;
  }
  t.exit_interval = f.opt_int("exit-interval");
  t.exit_duration_in_mins = f.opt_int("exit-duration-in-mins");
  t.eval_interval = f.get_int("eval-interval");
  t.eval_iters = f.get_int("eval-iters");
  t.start_eval_at_iter = f.opt_int("start-eval-at-iter");
  t.seed = uint64_t(f.get_int("seed"));
  t.deterministic = f.get_bool("deterministic-mode");
  return t;
}

OptimizerConfig build_optimizer(const FlagValues& f) {
  OptimizerConfig o;
  o.optimizer = f.get_string("optimizer");
  auto lr = f.opt_float("lr");
  if (!lr) throw UserError("--lr is required");
  o.lr = *lr;
  o.min_lr = f.get_float("min-lr");
  o.weight_decay = f.get_float("weight-decay");
  o.clip_grad = f.get_float("clip-grad");
  o.adam_beta1 = f.get_float("adam-beta1");
  o.adam_beta2 = f.get_float("adam-beta2");
  o.adam_eps = f.get_float("adam-eps");
  o.sgd_momentum = f.get_float("sgd-momentum");
  return o;
}

// Megatron's get_optimizer_param_scheduler: iteration-based flags are turned into samples.
LrScheduleConfig build_lr_schedule(const FlagValues& f, const OptimizerConfig& o, const TrainingConfig& t) {
  LrScheduleConfig s;
  s.init_lr = f.get_float("lr-warmup-init");
  s.max_lr = o.lr;
  s.min_lr = o.min_lr;
  const std::string style = f.get_string("lr-decay-style");
  s.decay_style = style == "constant" ? DecayStyle::Constant
                  : style == "cosine" ? DecayStyle::Cosine
                  : style == "inverse-square-root" ? DecayStyle::InverseSquareRoot
                  : style == "WSD" ? DecayStyle::WSD
                                   : DecayStyle::Linear;
  const std::string wsd = f.get_string("lr-wsd-decay-style");
  s.wsd_decay_style = wsd == "linear" ? WsdDecayStyle::Linear
                      : wsd == "cosine" ? WsdDecayStyle::Cosine
                      : wsd == "minus_sqrt" ? WsdDecayStyle::MinusSqrt
                                            : WsdDecayStyle::Exponential;
  const int64_t gbs = t.global_batch_size;
  const auto warmup_fraction = f.opt_float("lr-warmup-fraction");
  if (warmup_fraction && (f.given("lr-warmup-iters") || f.given("lr-warmup-samples")))
    throw UserError("--lr-warmup-fraction cannot be combined with --lr-warmup-iters or --lr-warmup-samples");
  std::optional<int64_t> wsd_steps;
  if (!t.train_samples) {
    if (f.given("lr-decay-samples") || f.given("lr-warmup-samples") || f.given("lr-wsd-decay-samples"))
      throw UserError("with --train-iters use --lr-decay-iters/--lr-warmup-iters/--lr-wsd-decay-iters, not the -samples flags");
    s.decay_steps = f.opt_int("lr-decay-iters").value_or(t.train_iters) * gbs;
    s.warmup_steps = warmup_fraction ? int64_t(*warmup_fraction * double(s.decay_steps)) : f.get_int("lr-warmup-iters") * gbs;
    s.wd_incr_steps = t.train_iters * gbs;
    if (auto w = f.opt_int("lr-wsd-decay-iters")) wsd_steps = *w * gbs;
  } else {
    if (f.given("lr-decay-iters") || f.given("lr-warmup-iters") || f.given("lr-wsd-decay-iters"))
      throw UserError("with --train-samples use --lr-decay-samples/--lr-warmup-samples/--lr-wsd-decay-samples, not the -iters flags");
    s.decay_steps = f.opt_int("lr-decay-samples").value_or(*t.train_samples);
    s.warmup_steps = warmup_fraction ? int64_t(*warmup_fraction * double(s.decay_steps)) : f.get_int("lr-warmup-samples");
    s.wd_incr_steps = *t.train_samples;
    wsd_steps = f.opt_int("lr-wsd-decay-samples");
  }
  if (s.decay_style == DecayStyle::WSD) {
    if (!wsd_steps) throw UserError("--lr-decay-style WSD needs --lr-wsd-decay-iters (or --lr-wsd-decay-samples)");
    s.wsd_decay_steps = *wsd_steps;
  }
  const std::string incr = f.get_string("weight-decay-incr-style");
  s.wd_incr_style = incr == "linear" ? WeightDecayIncrStyle::Linear
                    : incr == "cosine" ? WeightDecayIncrStyle::Cosine
                                       : WeightDecayIncrStyle::Constant;
  if (s.wd_incr_style == WeightDecayIncrStyle::Constant) {
    if (f.given("start-weight-decay") || f.given("end-weight-decay"))
      throw UserError("--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine");
    s.start_wd = s.end_wd = o.weight_decay;
  } else {
    auto start = f.opt_float("start-weight-decay"), end = f.opt_float("end-weight-decay");
    if (!start || !end)
      throw UserError("--weight-decay-incr-style " + incr + " needs both --start-weight-decay and --end-weight-decay");
    s.start_wd = *start;
    s.end_wd = *end;
  }
  return s;
}

std::string format_value(const FlagSpec& spec, const FlagValues& f) {
  if (spec.kind == FlagKind::Bool) return f.get_bool(spec.name) ? "true" : "false";
  if (f.given(spec.name)) return join(f.get_list(spec.name), " ");
  return *spec.default_value ? spec.default_value : "None";
}

// Data source and tokenizer. The built-in and mock datasets, and --tokenizer-type NullTokenizer,
// use Megatron's NullTokenizer: --vocab-size ids plus one end-of-document id.
struct DataWithVocab : DataConfig {
  int64_t tokenizer_vocab_size = 0;
};
DataWithVocab build_data(const FlagValues& f, const TokenizerResolver& tokenizer) {
  DataWithVocab d;
  const bool files = f.given("data-path") || f.given("train-data-path") || f.given("valid-data-path") || f.given("test-data-path");
  const int sources = int(files) + int(f.get_bool("mock-data")) + int(f.get_bool("builtin-data"));
  if (sources == 0) throw UserError("no training data: pass --data-path PREFIX, --mock-data or --builtin-data");
  if (sources > 1) throw UserError("choose one data source: --data-path, --mock-data or --builtin-data");
  d.source = f.get_bool("mock-data") ? DataSource::Mock : f.get_bool("builtin-data") ? DataSource::Builtin : DataSource::Files;
  d.data_path = f.get_list("data-path");
  d.train_data_path = f.get_list("train-data-path");
  d.valid_data_path = f.get_list("valid-data-path");
  d.test_data_path = f.get_list("test-data-path");
  if (f.given("data-path") && (f.given("train-data-path") || f.given("valid-data-path") || f.given("test-data-path")))
    throw UserError("--data-path cannot be combined with --train/valid/test-data-path");
  if (f.given("split")) {
    if (!f.given("data-path")) throw UserError("--split applies to --data-path only");
    d.split = f.get_string("split");
  }
  d.data_cache_path = f.get_string("data-cache-path");
  d.tokenizer_type = f.get_string("tokenizer-type");
  d.vocab_file = f.get_string("vocab-file");
  d.merge_file = f.get_string("merge-file");
  d.tokenizer_model = f.get_string("tokenizer-model");
  d.null_vocab_size = f.opt_int("vocab-size");
  d.eod_mask_loss = f.get_bool("eod-mask-loss");
  d.reset_position_ids = f.get_bool("reset-position-ids");
  d.reset_attention_mask = f.get_bool("reset-attention-mask");
  d.num_workers = int(f.get_int("num-workers"));
  if (d.num_workers < 0) throw UserError("--num-workers must not be negative");
  if (d.source == DataSource::Files) {
    if (d.tokenizer_type.empty()) throw UserError("--data-path needs --tokenizer-type (and its files)");
    if (d.tokenizer_type == "NullTokenizer" && !d.null_vocab_size)
      throw UserError("--tokenizer-type NullTokenizer needs --vocab-size");
  } else if (!d.tokenizer_type.empty() && d.tokenizer_type != "NullTokenizer") {
    throw UserError("--tokenizer-type is only used with --data-path (the built-in and mock datasets use --vocab-size)");
  }
  if (d.source != DataSource::Files || d.tokenizer_type == "NullTokenizer") {
    if (!d.null_vocab_size) throw UserError("--vocab-size is required (the built-in and mock datasets use a NullTokenizer)");
    if (*d.null_vocab_size <= 1) throw UserError("--vocab-size must be at least 2");
    d.tokenizer_vocab_size = *d.null_vocab_size + 1;
    d.eod = *d.null_vocab_size;
    if (d.source == DataSource::Builtin) d.eod = -1;  // the synthetic text has no documents
  } else {
    if (!tokenizer) throw UserError("--tokenizer-type " + d.tokenizer_type + " needs the trainer to build the tokenizer");
    TokenizerInfo info = tokenizer(d);
    d.tokenizer_vocab_size = info.vocab_size;
    d.eod = info.eod;
  }
  return d;
}

DistributedConfig build_distributed(const FlagValues& f, const ParallelSizes& p) {
  DistributedConfig d;
  d.sequence_parallel = f.get_bool("sequence-parallel") && p.tp > 1;  // Megatron ignores SP without TP
  const auto per_stage = f.opt_int("num-layers-per-virtual-pipeline-stage");
  const auto per_rank = f.opt_int("num-virtual-stages-per-pipeline-rank");
  if (per_stage && per_rank)
    throw UserError("--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank cannot be used together");
  if ((per_stage || per_rank) && p.pp < 2)
    throw UserError("a virtual pipeline needs --pipeline-model-parallel-size > 1");
  if (per_stage) {
    const int64_t layers = f.get_int("num-layers");
    if (*per_stage <= 0 || layers % (*per_stage * p.pp) != 0)
      throw UserError("--num-layers must be divisible by --num-layers-per-virtual-pipeline-stage x --pipeline-model-parallel-size");
    d.virtual_stages = int(layers / (*per_stage * p.pp));
  }
  if (per_rank) {
    if (*per_rank <= 0) throw UserError("--num-virtual-stages-per-pipeline-rank must be positive");
    d.virtual_stages = int(*per_rank);
  }
  d.first_stage_layers = f.opt_int("decoder-first-pipeline-num-layers");
  d.last_stage_layers = f.opt_int("decoder-last-pipeline-num-layers");
  d.distributed_optimizer = f.get_bool("use-distributed-optimizer");
  d.overlap_grad_reduce = f.get_bool("overlap-grad-reduce");
  d.overlap_param_gather = f.get_bool("overlap-param-gather");
  d.bucket_numel = f.opt_int("ddp-bucket-size").value_or(std::max<int64_t>(40000000, 1000000 * int64_t(p.dp)));
  if (d.bucket_numel <= 0) throw UserError("--ddp-bucket-size must be positive");
  d.timeout_minutes = int(f.get_int("distributed-timeout-minutes"));
  if (d.timeout_minutes <= 0) throw UserError("--distributed-timeout-minutes must be positive");
  d.hang_report_seconds = int(f.get_int("hang-report-seconds"));
  if (d.hang_report_seconds <= 0) throw UserError("--hang-report-seconds must be positive");
  d.overlap_p2p = !f.get_bool("no-overlap-p2p-communication");
  d.overlap_p2p_warmup_flush = f.get_bool("overlap-p2p-communication-warmup-flush");
  return d;
}

// Megatron: p2p overlap exists in the interleaved schedule only; elsewhere it is switched off,
// with a warning when there is a pipeline at all.
void resolve_p2p_overlap(DistributedConfig& d, const ParallelSizes& p, std::vector<std::string>& notices) {
  if (d.virtual_stages > 1) return;
  if (d.overlap_p2p && p.pp > 1)
    notices.push_back("pipeline p2p overlap (--no-overlap-p2p-communication not given) is switched off: the "
                      "non-interleaved schedule does not overlap p2p communication (Megatron)");
  d.overlap_p2p = false;
}

// Megatron's --exit-signal names; SIGKILL and SIGSTOP cannot be caught.
int signal_number(const std::string& name) {
  static const std::vector<std::pair<const char*, int>> table = {
      {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},     {"SIGQUIT", SIGQUIT},     {"SIGILL", SIGILL},   {"SIGTRAP", SIGTRAP},
      {"SIGABRT", SIGABRT}, {"SIGBUS", SIGBUS},     {"SIGFPE", SIGFPE},       {"SIGUSR1", SIGUSR1}, {"SIGSEGV", SIGSEGV},
      {"SIGUSR2", SIGUSR2}, {"SIGPIPE", SIGPIPE},   {"SIGALRM", SIGALRM},     {"SIGTERM", SIGTERM}, {"SIGSTKFLT", SIGSTKFLT},
      {"SIGCHLD", SIGCHLD}, {"SIGCONT", SIGCONT},   {"SIGTSTP", SIGTSTP},     {"SIGTTIN", SIGTTIN}, {"SIGTTOU", SIGTTOU},
      {"SIGURG", SIGURG},   {"SIGXCPU", SIGXCPU},   {"SIGXFSZ", SIGXFSZ},     {"SIGVTALRM", SIGVTALRM},
      {"SIGPROF", SIGPROF}, {"SIGWINCH", SIGWINCH}, {"SIGIO", SIGIO},         {"SIGPWR", SIGPWR},   {"SIGSYS", SIGSYS},
      {"SIGRTMIN", SIGRTMIN}, {"SIGRTMAX", SIGRTMAX}};
  for (const auto& [n, number] : table)
    if (name == n) return number;
  throw UserError("--exit-signal " + name + ": this signal cannot be caught; choose e.g. SIGTERM, SIGINT or SIGUSR1");
}

CheckpointConfig build_checkpoint(const FlagValues& f, std::vector<std::string>& notices) {
  CheckpointConfig k;
  k.save = f.get_string("save");
  k.load = f.get_string("load");
  k.save_interval = f.opt_int("save-interval");
  if (auto alias = f.opt_int("persistent-save-interval")) {  // Megatron's second name for it
    if (k.save_interval && *k.save_interval != *alias)
      throw UserError("--save-interval and --persistent-save-interval name the same setting; give one value");
    k.save_interval = alias;
  }
  if (k.save_interval && *k.save_interval <= 0) throw UserError("--save-interval must be positive");
  k.save_retain_interval = f.opt_int("save-retain-interval");
  if (k.save_retain_interval && *k.save_retain_interval <= 0) throw UserError("--save-retain-interval must be positive");
  k.non_persistent_save_interval = f.opt_int("non-persistent-save-interval");
  const std::string np_type = f.get_string("non-persistent-ckpt-type");
  if (np_type == "local" || np_type == "in_memory")
    throw UserError("--non-persistent-ckpt-type " + np_type + ": only global non-persistent checkpoints are "
                    "implemented (local and in-memory ones need NVIDIA's resiliency extension); use global");
  k.non_persistent_global = np_type == "global";
  if (k.non_persistent_save_interval) {
    if (*k.non_persistent_save_interval <= 0) throw UserError("--non-persistent-save-interval must be positive");
    if (!k.non_persistent_global)
      throw UserError("--non-persistent-save-interval needs --non-persistent-ckpt-type global");
  }
  k.non_persistent_dir = f.get_string("non-persistent-global-ckpt-dir");
  auto trimmed = [](std::string d) {
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    return d;
  };
  if (!k.non_persistent_dir.empty() &&
      (trimmed(k.non_persistent_dir) == trimmed(k.save) || trimmed(k.non_persistent_dir) == trimmed(k.load)))
    throw UserError("--non-persistent-global-ckpt-dir must differ from --save and --load: only the newest "
                    "non-persistent checkpoint is kept there, so the others would be deleted");
  k.save_optim = !f.get_bool("no-save-optim");
  k.save_rng = !f.get_bool("no-save-rng");
  k.load_optim = !f.get_bool("no-load-optim");
  k.load_rng = !f.get_bool("no-load-rng");
  k.finetune = f.get_bool("finetune");
  k.load_main_params_from_ckpt = f.get_bool("load-main-params-from-ckpt");
  k.ckpt_step = f.opt_int("ckpt-step");
  if (k.ckpt_step && *k.ckpt_step < 0) throw UserError("--ckpt-step must not be negative");
  k.exit_on_missing_checkpoint = f.get_bool("exit-on-missing-checkpoint");
  k.async_save = f.get_bool("async-save");
  k.fully_parallel_save = !f.get_bool("no-ckpt-fully-parallel-save");
  k.dist_ckpt_strictness = f.get_string("dist-ckpt-strictness");
  if (f.get_bool("verify-integrity") && f.get_bool("no-verify-integrity"))
    throw UserError("--verify-integrity and --no-verify-integrity contradict each other; give one");
  k.verify_checksums = !f.get_bool("no-verify-integrity");
  k.override_opt_param_scheduler = f.get_bool("override-opt-param-scheduler") || f.get_bool("override-opt_param-scheduler");
  k.use_checkpoint_opt_param_scheduler =
      f.get_bool("use-checkpoint-opt-param-scheduler") || f.get_bool("use-checkpoint-opt_param-scheduler");
  if (k.override_opt_param_scheduler && k.use_checkpoint_opt_param_scheduler)
    throw UserError("both override and use-checkpoint are set: --override-opt-param-scheduler and "
                    "--use-checkpoint-opt_param-scheduler choose opposite schedules; give one");
  k.test_kill_at = f.get_string("fp8tron-test-kill-at");
  if (!k.test_kill_at.empty()) {
    const std::string name = k.test_kill_at.substr(0, k.test_kill_at.find('@'));
    const auto& names = checkpoint::fault_point_names();
    if (std::find(names.begin(), names.end(), name) == names.end())
      throw UserError("--fp8tron-test-kill-at " + k.test_kill_at + ": unknown point; known points: " + join(names, ", "));
  }
  k.exit_signal_handler = f.get_bool("exit-signal-handler");
  k.exit_signal_name = f.get_string("exit-signal");
  k.exit_signal = signal_number(k.exit_signal_name);
  if (f.given("ckpt-format"))
    notices.push_back("--ckpt-format " + f.get_string("ckpt-format") +
                      ": fp8tron reads and writes its own checkpoint format (per-rank safetensors shards + one JSON "
                      "metadata file in Megatron's iter_NNNNNNN layout), whatever the value");
  return k;
}

}  // namespace

int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tp) {
  const int64_t multiple = divisible_by * tp;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

Config build_config(const FlagValues& flags, const LaunchEnv& launch, bool gpu_available, const TokenizerResolver& tokenizer) {
  Config c;
  c.launch = launch;
  c.dry_run = flags.get_bool("dry-run");
  classify_given_flags(flags, c);

  const int tp = int(flags.get_int("tensor-model-parallel-size"));
  c.parallel = ParallelSizes::derive(launch.world_size, tp, int(flags.get_int("context-parallel-size")),
                                     int(flags.get_int("pipeline-model-parallel-size")),
                                     int(flags.get_int("expert-model-parallel-size")),
                                     int(flags.opt_int("expert-tensor-parallel-size").value_or(tp)),
                                     flags.get_bool("use-tp-pp-dp-mapping"));
  c.distributed = build_distributed(flags, c.parallel);
  resolve_p2p_overlap(c.distributed, c.parallel, c.hint_warnings);
  c.checkpoint = build_checkpoint(flags, c.hint_warnings);
  const DataWithVocab data = build_data(flags, tokenizer);
  c.data = data;
  c.model = build_model(flags, tp, data.tokenizer_vocab_size);
  c.model.recompute = build_recompute_config(flags, c.hint_warnings);
  c.context_parallel = build_context_parallel_config(flags);
  c.model.moe = build_moe_config(flags, c.model, c.hint_warnings);
  c.precision = build_precision(flags);
  c.model.params_dtype = c.precision.params_dtype;
  c.training = build_training(flags, c.parallel.dp);
  c.training.numerics = build_numerics(flags, c.precision, c.hint_warnings);
  c.optimizer = build_optimizer(flags);
  c.lr_schedule = build_lr_schedule(flags, c.optimizer, c.training);

  c.logging.log_interval = flags.get_int("log-interval");
  c.logging.log_throughput = flags.get_bool("log-throughput");
  c.logging.log_params_norm = flags.get_bool("log-params-norm");
  c.logging.timing_log_level = int(flags.get_int("timing-log-level"));
  c.logging.timing_log_option = flags.get_string("timing-log-option");
  c.logging.tensorboard_dir = flags.get_string("tensorboard-dir");
  c.logging.tensorboard_log_interval = flags.get_int("tensorboard-log-interval");
  c.logging.log_timers_to_tensorboard = flags.get_bool("log-timers-to-tensorboard");
  c.logging.log_validation_ppl_to_tensorboard = flags.get_bool("log-validation-ppl-to-tensorboard");
  c.logging.log_memory_to_tensorboard = flags.get_bool("log-memory-to-tensorboard");
  c.logging.log_world_size_to_tensorboard = flags.get_bool("log-world-size-to-tensorboard");
  c.logging.log_fp8_stats_to_tensorboard = flags.get_bool("log-fp8-stats-to-tensorboard");
  c.profiling.enabled = flags.get_bool("profile");
  c.profiling.step_start = flags.get_int("profile-step-start");
  c.profiling.step_end = flags.get_int("profile-step-end");
  if (flags.given("profile-ranks")) {
    c.profiling.ranks.clear();
    for (const auto& r : flags.get_list("profile-ranks")) c.profiling.ranks.push_back(std::stoi(r));
  }
  c.profiling.pytorch_profiler = flags.get_bool("use-pytorch-profiler");
  c.profiling.record_shapes = flags.get_bool("pytorch-profiler-collect-shapes");
  c.logging.log_loss_scale_to_tensorboard =
      !flags.get_bool("no-log-loss-scale-to-tensorboard") && !flags.get_bool("disable-log-loss-scale-to-tensorboard");
  c.logging.log_all_ranks = flags.get_bool("log-all-ranks");

  c.device = flags.get_string("device");
  if (c.device.empty()) c.device = gpu_available ? "cuda" : "cpu";
  if (c.device == "cuda" && !gpu_available && !c.dry_run)
    throw UserError("--device cuda: no CUDA GPU is visible to this process (use --device cpu)");
  c.precision.fp8 = build_fp8(flags, c.model, c.precision, c.device == "cuda");
  c.model.moe.expert_gemm_fp8 = c.precision.fp8.grouped_gemm_fp8;
  c.distributed.tp_overlap = build_tp_overlap(flags, tp, c.precision.fp8.enabled(), c.hint_warnings);

  for (const auto& spec : flag_table())
    if ((spec.support == Support::Yes && !is_test_flag(spec)) || flags.given(spec.name))
      c.resolved_flags.emplace_back(spec.name, format_value(spec, flags));
  validate_config(c, flags);
  for (auto& warning : inert_flag_warnings(c, flags)) c.hint_warnings.push_back(std::move(warning));
  return c;
}

void require_supported(const Config& config) {
  if (config.not_supported_yet.empty()) return;
  throw UserError("not supported yet: " + config.not_supported_yet.front() +
                  (config.not_supported_yet.size() > 1
                       ? strprintf(" (and %zu more; --dry-run lists them)", config.not_supported_yet.size() - 1)
                       : ""));
}

}  // namespace fp8tron
