#include "trainer/cli/config_builder.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <map>
#include <sstream>

#include "core/config/batch_schedule.h"
#include "core/error.h"
#include "core/text.h"
#include "fp8/recipe.h"
#include "parallel/pipeline_layout.h"
#include "trainer/cli/model_variant_args.h"
#include "checkpoint/fault_points.h"
#include "trainer/cli/context_parallel_args.h"
#include "trainer/cli/sharded_dp_args.h"
#include "trainer/cli/logging_args.h"
#include "trainer/cli/moe_args.h"
#include "trainer/cli/fim_args.h"
#include "trainer/cli/mup_args.h"
#include "trainer/cli/rerun_args.h"
#include "trainer/cli/cuda_graph_args.h"
#include "trainer/cli/determinism_env.h"
#include "trainer/cli/offload_args.h"
#include "trainer/cli/recompute_args.h"
#include "trainer/cli/torch_dist_save_args.h"
#include "trainer/cli/tp_overlap_args.h"

namespace fp8tron {
namespace {

// Collects what the given flags' support level asks for: NotYet and Unsupported are recorded or
// thrown, HintOnly becomes a warning line. A NotYet flag counts only when it differs from default.
void classify_given_flags(const FlagValues& flags, Config& c) {
  for (const auto& [name, values] : flags.all_given()) {
    const FlagSpec* spec = find_flag(name);
    const std::string flag = "--" + name;
    // A value flag given at Megatron's default asks for nothing fp8tron lacks.
    const bool at_default =
        spec->kind != FlagKind::Bool && values.size() == 1 && *spec->default_value && values[0] == spec->default_value;
    if (at_default && spec->support != Support::Yes) continue;
    switch (spec->support) {
      case Support::Yes:
        break;
      case Support::NotYet:
        c.not_supported_yet.push_back(flag + " (" + spec->note + ")");
        break;
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
  m.position_embedding = parse_position_embedding(f.get_string("position-embedding-type"));
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
  m.attention_output_gate = f.get_bool("attention-output-gate");
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
  build_model_variants(f, m);
  return m;
}

PrecisionConfig build_precision(const FlagValues& f) {
  PrecisionConfig p;
  const bool bf16 = f.get_bool("bf16"), fp16 = f.get_bool("fp16");
  if (bf16 && fp16) throw UserError("--bf16 and --fp16 cannot be used together; choose one");
  p.params_dtype = bf16 ? ParamDtype::Bf16 : fp16 ? ParamDtype::Fp16 : ParamDtype::Fp32;
  // Megatron forces fp32 gradient accumulation and reduction for bf16.
  p.gradient_accumulation_fusion = !f.get_bool("no-gradient-accumulation-fusion");
  // --main-grads-dtype bf16 (precision-aware optimizer) keeps bf16's gradient buffer in bf16, as
  // Megatron does by not switching on --accumulate-allreduce-grads-in-fp32 (validation.cpp refuses
  // the combinations where it would do nothing).
  // --grad-reduce-in-bf16 does the same for any bf16 run: Megatron then turns
  // --accumulate-allreduce-grads-in-fp32 off, even when given (it reads the flag only with --bf16).
  const bool bf16_main_grads = f.get_string("main-grads-dtype") == "bf16";
  const bool bf16_reduction = bf16 && f.get_bool("grad-reduce-in-bf16");
  p.grads_in_fp32 = p.params_dtype == ParamDtype::Fp32 ||
                    (!bf16_reduction && ((bf16 && !bf16_main_grads) || f.get_bool("accumulate-allreduce-grads-in-fp32")));
  p.static_loss_scale = f.opt_float("loss-scale");
  p.initial_loss_scale = f.get_float("initial-loss-scale");
  p.min_loss_scale = f.get_float("min-loss-scale");
  p.loss_scale_window = int64_t(f.get_float("loss-scale-window"));
  p.hysteresis = int(f.get_int("hysteresis"));
  return p;
}

// FP8TRON_GEMM_AUTOTUNE (environment): 0 keeps the FP8 GEMMs on cuBLASLt's heuristic choice, 1 or
// unset times the candidates on first use (fp8/gemm.h). Read here, once, for the whole run.
bool gemm_autotune_from_environment(const EnvLookup& lookup) {
  const char* v = lookup("FP8TRON_GEMM_AUTOTUNE");
  if (!v || !*v) return true;
  const std::string value(v);
  if (value != "0" && value != "1") throw UserError("FP8TRON_GEMM_AUTOTUNE must be 0 or 1, not '" + value + "'");
  return value == "1";
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
  c.keep_transposes = f.get_string("fp8-transposes") == "keep";
  c.wgrad = !f.get_bool("no-fp8-wgrad") && !f.get_bool("disable-fp8-wgrad");
  c.dot_product_attention = f.get_bool("fp8-dot-product-attention");
  c.attention_emulated = f.get_bool("fp8tron-test-fp8-attention-emulated");
  c.grouped_gemm_fp8 = !f.get_bool("no-use-gmm-fp8");
  c.param_gather = f.get_bool("fp8-param-gather");
  if (c.min_features < 0) throw UserError("--fp8-min-features must be >= 0");
  return c;
}

// --rampup-batch-size START INCREMENT SAMPLES.
std::optional<BatchRampup> parse_rampup(const FlagValues& f) {
  if (!f.given("rampup-batch-size")) return std::nullopt;
  const auto v = f.get_list("rampup-batch-size");
  if (v.size() != 3)
    throw UserError("--rampup-batch-size takes three numbers: <start batch size> <batch size increment> <ramp-up samples>");
  BatchRampup r;
  int64_t* fields[3] = {&r.start, &r.increment, &r.samples};
  for (size_t i = 0; i < 3; ++i) {
    try {
      size_t pos = 0;
      *fields[i] = std::stoll(v[i], &pos);
      if (pos != v[i].size()) throw std::invalid_argument(v[i]);
    } catch (const std::exception&) {
      throw UserError("--rampup-batch-size expects integers, got '" + v[i] + "'");
    }
  }
  return r;
}

// --step-batch-size-schedule "THRESHOLD:BS ...": entries split on spaces or commas, numbers with
// K/M/B/T suffixes (parsed as floats, then truncated), thresholds in tokens (// --seq-length).
std::vector<std::pair<int64_t, int64_t>> parse_step_schedule(const std::string& text, int64_t seq_length) {
  auto number = [](const std::string& word) -> int64_t {
    std::string v = word;
    double multiplier = 1;
    for (auto& ch : v) ch = char(std::toupper(static_cast<unsigned char>(ch)));
    if (!v.empty() && std::string("KMBT").find(v.back()) != std::string::npos) {
      multiplier = v.back() == 'K' ? 1e3 : v.back() == 'M' ? 1e6 : v.back() == 'B' ? 1e9 : 1e12;
      v.pop_back();
    }
    try {
      size_t pos = 0;
      const double d = std::stod(v, &pos) * multiplier;
      // Negative values would floor differently from Python (and are meaningless); inf/nan and
      // values past int64 have no integer (Megatron's int() raises on them).
      if (pos != v.size() || !(d >= 0 && d < 9.2e18)) throw std::invalid_argument(v);
      return int64_t(d);  // int(float(...)): truncation
    } catch (const std::exception&) {
      throw UserError("--step-batch-size-schedule: '" + word + "' is not a non-negative number");
    }
  };
  std::string spaced = text;
  std::replace(spaced.begin(), spaced.end(), ',', ' ');
  std::vector<std::pair<int64_t, int64_t>> out;
  std::istringstream in(spaced);
  for (std::string entry; in >> entry;) {
    const size_t colon = entry.find(':');
    if (colon == std::string::npos)
      throw UserError("--step-batch-size-schedule: invalid entry \"" + entry + "\" (expected THRESHOLD:BATCH_SIZE)");
    out.emplace_back(number(entry.substr(0, colon)) / seq_length, number(entry.substr(colon + 1)));
  }
  if (out.empty()) throw UserError("--step-batch-size-schedule needs at least one THRESHOLD:BATCH_SIZE entry");
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
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
  t.rampup = parse_rampup(f);
  t.decrease_batch_size_if_needed = f.get_bool("decrease-batch-size-if-needed");
  if (f.given("step-batch-size-schedule")) {
    // Megatron: the schedule sets the training batches; --global-batch-size stays micro x dp (the
    // evaluation batch) and may not be given.
    if (f.given("global-batch-size"))
      throw UserError("Cannot specify both --step-batch-size-schedule and --global-batch-size");
    t.step_batch_schedule = parse_step_schedule(f.get_string("step-batch-size-schedule"), f.get_int("seq-length"));
  }
  const int64_t micro_times_dp = t.micro_batch_size * dp;
  if (t.global_batch_size % micro_times_dp != 0 && !(t.rampup && t.decrease_batch_size_if_needed))
    throw UserError(strprintf("--global-batch-size (%lld) is not divisible by --micro-batch-size (%lld) x "
                              "data-parallel size (%d)",
                              (long long)t.global_batch_size, (long long)t.micro_batch_size, dp));
  const BatchSchedule batches = BatchSchedule::of(t, dp);
  // After any ramp-up (the evaluation batch with a step schedule, as Megatron's).
  t.num_micro_batches = t.step_batch_schedule.empty() ? batches.micro_batches(int64_t(1) << 62)
                                                      : t.global_batch_size / micro_times_dp;
  t.eval_global_batch_size = f.opt_int("eval-global-batch-size").value_or(t.num_micro_batches * micro_times_dp);
  t.eval_micro_batch_size = f.opt_int("eval-micro-batch-size").value_or(t.micro_batch_size);
  if (t.eval_micro_batch_size <= 0)
    throw UserError(strprintf("--eval-micro-batch-size (%lld) must be positive", (long long)t.eval_micro_batch_size));
  const int64_t eval_micro_times_dp = t.eval_micro_batch_size * dp;
  const char* eval_micro_flag = f.opt_int("eval-micro-batch-size") ? "--eval-micro-batch-size" : "--micro-batch-size";
  if (t.eval_global_batch_size <= 0 || t.eval_global_batch_size % eval_micro_times_dp != 0)
    throw UserError(strprintf("--eval-global-batch-size (%lld) must be a positive multiple of %s (%lld) x "
                              "data-parallel size (%d)",
                              (long long)t.eval_global_batch_size, eval_micro_flag, (long long)t.eval_micro_batch_size, dp));
  t.eval_micro_batches = t.eval_global_batch_size / eval_micro_times_dp;
  // Megatron: iteration mode is "--train-iters given and non-zero"; sample mode likewise.
  const auto iters = f.opt_int("train-iters");
  const auto samples = f.opt_int("train-samples");
  const bool iteration_mode = iters && *iters != 0, sample_mode = samples && *samples != 0;
  if (iteration_mode && samples) throw UserError("--train-iters and --train-samples cannot be used together; choose one");
  if (sample_mode && iters) throw UserError("--train-iters and --train-samples cannot be used together; choose one");
  if (!iteration_mode && !sample_mode) throw UserError("either --train-iters or --train-samples is required (and non-zero)");
  if (iteration_mode) {
    if (*iters < 0) throw UserError("--train-iters must be positive");
    if (t.rampup) throw UserError("--rampup-batch-size needs sample-based training (--train-samples), as in Megatron");
    t.train_iters = *iters;
  } else {
    if (*samples < 0) throw UserError("--train-samples must be positive");
    t.train_samples = samples;
    t.train_iters = batches.train_iters(*samples);
    if (t.train_iters <= 0) throw UserError("--train-samples is smaller than one --global-batch-size");
  }
  t.exit_interval = f.opt_int("exit-interval");
  t.exit_duration_in_mins = f.opt_int("exit-duration-in-mins");
  t.eval_interval = f.get_int("eval-interval");
  t.eval_iters = f.get_int("eval-iters");
  t.start_eval_at_iter = f.opt_int("start-eval-at-iter");
  t.seed = uint64_t(f.get_int("seed"));
  t.deterministic = f.get_bool("deterministic-mode");
  t.calculate_per_token_loss = f.get_bool("calculate-per-token-loss");
  t.weight_hash_interval = f.opt_int("check-weight-hash-across-dp-replicas-interval");
  if (t.weight_hash_interval && *t.weight_hash_interval <= 0)
    throw UserError("--check-weight-hash-across-dp-replicas-interval must be positive");
  return t;
}

// --optimizer muon (dist_muon: the deprecated spelling of muon + --use-distributed-optimizer).
void build_muon(const FlagValues& f, OptimizerConfig& o) {
  if (o.optimizer == "lion" || o.optimizer == "soap" || o.optimizer == "adaptive_muon")
    throw UserError("--optimizer " + o.optimizer + " is not supported by fp8tron (adam, sgd and muon are)");
  if (o.optimizer == "dist_muon") o.optimizer = "muon";
  MuonConfig& m = o.muon;
  m.momentum = f.get_float("muon-momentum");
  m.nesterov = f.get_bool("muon-nesterov");
  m.split_qkv = !f.get_bool("muon-no-split-qkv");
  m.scale_mode = f.get_string("muon-scale-mode");
  m.matmul_precision = f.get_string("muon-fp32-matmul-prec");
  m.coefficient_type = f.get_string("muon-coefficient-type");
  m.num_ns_steps = f.get_int("muon-num-ns-steps");
  m.tp_mode = f.get_string("muon-tp-mode");
  m.extra_scale_factor = f.get_float("muon-extra-scale-factor");
  if (o.optimizer != "muon") return;
  if (m.matmul_precision == "low")
    throw UserError("--muon-fp32-matmul-prec low is not a torch matmul precision (Megatron fails on it too); use medium or high");
  static const std::vector<std::string> coefficients = {"quintic", "simple", "polar_express", "cans", "aol"};
  if (std::find(coefficients.begin(), coefficients.end(), m.coefficient_type) == coefficients.end())
    throw UserError("--muon-coefficient-type " + m.coefficient_type + " is not supported (choose from " +
                    join(coefficients, ", ") + ")");
  if (m.num_ns_steps <= 0) throw UserError("--muon-num-ns-steps must be positive");
  if (f.get_string("muon-scalar-optimizer") != "adam")
    throw UserError("--muon-scalar-optimizer " + f.get_string("muon-scalar-optimizer") +
                    " is not supported by fp8tron (adam is)");
}

// --exp-avg-dtype / --exp-avg-sq-dtype values (the flag table restricts them to these four).
StateDtype state_dtype(const std::string& name) {
  if (name == "bf16") return StateDtype::Bf16;
  if (name == "fp16") return StateDtype::Fp16;
  if (name == "fp8") return StateDtype::Fp8;
  return StateDtype::Fp32;
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
  o.decoupled_lr = f.opt_float("decoupled-lr");
  o.decoupled_min_lr = f.opt_float("decoupled-min-lr");
  if (o.decoupled_min_lr && !o.decoupled_lr)
    throw UserError("--decoupled-min-lr needs --decoupled-lr (it is the minimum of that learning rate)");
  o.apply_wd_to_qk_layernorm =
      f.get_bool("apply-wd-to-qk-layernorm") || f.get_string("no-weight-decay-cond-type") == "apply_wd_to_qk_layernorm";
  build_muon(f, o);
  o.precision_aware.enabled = f.get_bool("use-precision-aware-optimizer");
  o.precision_aware.main_params = state_dtype(f.get_string("main-params-dtype"));
  o.precision_aware.exp_avg = state_dtype(f.get_string("exp-avg-dtype"));
  o.precision_aware.exp_avg_sq = state_dtype(f.get_string("exp-avg-sq-dtype"));
  return o;
}

// Megatron's get_optimizer_param_scheduler: iteration-based flags are turned into samples.
LrScheduleConfig build_lr_schedule(const FlagValues& f, const OptimizerConfig& o, const TrainingConfig& t,
                                   std::vector<std::string>& warnings) {
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
  std::optional<int64_t> wsd_steps;
  // Megatron's validate_args: the other mode's flags must be unset or zero (an explicit
  // `--lr-warmup-samples 0` with --train-iters is fine); the other mode's WSD flag is unused.
  if (!t.train_samples) {
    if (f.given("lr-decay-samples")) throw UserError("--lr-decay-samples is for --train-samples; with --train-iters use --lr-decay-iters");
    if (f.get_int("lr-warmup-samples") != 0)
      throw UserError("--lr-warmup-samples is for --train-samples; with --train-iters use --lr-warmup-iters");
    if (warmup_fraction && f.get_int("lr-warmup-iters") != 0)
      throw UserError("--lr-warmup-fraction and --lr-warmup-iters: give only one");
    if (f.given("lr-wsd-decay-samples")) warnings.push_back("--lr-wsd-decay-samples has no effect with --train-iters (use --lr-wsd-decay-iters)");
    s.decay_steps = f.opt_int("lr-decay-iters").value_or(t.train_iters) * gbs;
    s.warmup_steps = warmup_fraction ? *warmup_fraction * double(s.decay_steps) : double(f.get_int("lr-warmup-iters") * gbs);
    s.wd_incr_steps = t.train_iters * gbs;
    if (auto w = f.opt_int("lr-wsd-decay-iters")) wsd_steps = *w * gbs;
  } else {
    if (f.given("lr-decay-iters")) throw UserError("--lr-decay-iters is for --train-iters; with --train-samples use --lr-decay-samples");
    if (f.get_int("lr-warmup-iters") != 0)
      throw UserError("--lr-warmup-iters is for --train-iters; with --train-samples use --lr-warmup-samples");
    if (warmup_fraction && f.get_int("lr-warmup-samples") != 0)
      throw UserError("--lr-warmup-fraction and --lr-warmup-samples: give only one");
    if (f.given("lr-wsd-decay-iters")) warnings.push_back("--lr-wsd-decay-iters has no effect with --train-samples (use --lr-wsd-decay-samples)");
    s.decay_steps = f.opt_int("lr-decay-samples").value_or(*t.train_samples);
    s.warmup_steps = warmup_fraction ? *warmup_fraction * double(s.decay_steps) : double(f.get_int("lr-warmup-samples"));
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
  if (spec.kind == FlagKind::Bool) {
    // A switch with a --no- twin is on unless the twin is given, as Megatron's store_false
    // destinations print (check_for_nan_in_loss_and_grad is true by default).
    const std::string twin = std::string("no-") + spec.name;
    if (find_flag(twin) != nullptr) return f.get_bool(spec.name) || !f.get_bool(twin) ? "true" : "false";
    return f.get_bool(spec.name) ? "true" : "false";
  }
  if (f.given(spec.name)) return join(f.get_list(spec.name), " ");
  return *spec.default_value ? spec.default_value : "None";
}

// The argument table Megatron prints: one line per argument. A --no- twin is folded into its
// switch, and spellings that differ only by '_' against '-' (--override-opt_param-scheduler) are
// one argument.
std::vector<std::pair<std::string, std::string>> resolved_flags(const FlagValues& flags) {
  std::vector<std::pair<std::string, std::string>> out;
  std::map<std::string, size_t> line_of;  // spelling with '-' only -> its line in out
  for (const auto& spec : flag_table()) {
    if (!((spec.support == Support::Yes && !is_test_flag(spec)) || flags.given(spec.name))) continue;
    const std::string name = spec.name;
    if (spec.kind == FlagKind::Bool && name.rfind("no-", 0) == 0 && find_flag(name.substr(3)) != nullptr) continue;
    std::string key = name;
    std::replace(key.begin(), key.end(), '_', '-');
    auto [it, first] = line_of.emplace(key, out.size());
    if (first) out.emplace_back(name, format_value(spec, flags));
    else if (flags.given(name)) out[it->second].second = format_value(spec, flags);  // the spelling the user gave
  }
  return out;
}

// Data source and tokenizer, as pretrain_gpt.py resolves them: --tokenizer-type defaults to
// GPT2BPETokenizer (its only args_defaults entry) and the tokenizer is built for mock data too.
// fp8tron keeps two conveniences: --mock-data with --vocab-size and no --tokenizer-type uses a
// NullTokenizer (said in the log), and --builtin-data (fp8tron's own synthetic text) has
// --vocab-size ids plus one end-of-document id.
struct DataWithVocab : DataConfig {
  int64_t tokenizer_vocab_size = 0;
};

void read_tokenizer_flags(const FlagValues& f, DataConfig& d) {
  d.tokenizer_defaulted = !f.given("tokenizer-type");
  d.tokenizer_type = d.tokenizer_defaulted ? "GPT2BPETokenizer" : f.get_string("tokenizer-type");
  d.vocab_file = f.get_string("vocab-file");
  d.merge_file = f.get_string("merge-file");
  d.tokenizer_model = f.get_string("tokenizer-model");
  d.null_vocab_size = f.opt_int("vocab-size");
  d.null_eod_id = f.opt_int("null-tokenizer-eod-id");
  d.pad = f.get_int("null-tokenizer-pad-id");
  d.tiktoken_pattern = f.get_string("tiktoken-pattern");
  d.tiktoken_num_special_tokens = f.get_int("tiktoken-num-special-tokens");
  d.special_tokens = f.get_list("tokenizer-special-tokens");
}

// The tokenizer the data needs, or the notice/refusal when the type is pretrain_gpt.py's default.
void resolve_tokenizer_type(DataWithVocab& d, std::vector<std::string>& notices) {
  if (!d.tokenizer_defaulted) {
    notices.push_back("Overriding default arguments for tokenizer_type:GPT2BPETokenizer with tokenizer_type:" +
                      d.tokenizer_type);
    return;
  }
  if (d.source == DataSource::Mock && d.null_vocab_size && d.vocab_file.empty() && d.merge_file.empty()) {
    d.tokenizer_type = "NullTokenizer";
    notices.push_back(strprintf("--mock-data without --tokenizer-type: using a NullTokenizer of --vocab-size %lld ids "
                                "(Megatron's pretrain_gpt.py would default to GPT2BPETokenizer)",
                                (long long)*d.null_vocab_size));
    return;
  }
  if (d.vocab_file.empty() || d.merge_file.empty())
    throw UserError(std::string("--tokenizer-type was not given, so it is GPT2BPETokenizer (pretrain_gpt.py's default), "
                                "which needs --vocab-file and --merge-file (fp8tron does not download GPT-2's files)") +
                    (d.source == DataSource::Mock ? "; or pass --vocab-size for a NullTokenizer" : "") +
                    "; or pass --tokenizer-type with its files");
}

DataWithVocab build_data(const FlagValues& f, const TokenizerResolver& tokenizer, std::vector<std::string>& notices,
                         std::vector<std::string>& warnings) {
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
  const bool per_split = f.given("train-data-path") || f.given("valid-data-path") || f.given("test-data-path");
  if (f.given("data-path") && per_split) throw UserError("--data-path cannot be combined with --train/valid/test-data-path");
  // Megatron: --split is None unless given; with --data-path it falls back to the legacy value
  // (with a warning); the mock dataset overwrites it with 1,1,1.
  if (f.given("split")) {
    if (per_split) throw UserError("--split cannot be combined with --train/valid/test-data-path (each split has its own files)");
    if (d.source == DataSource::Mock) warnings.push_back("--split has no effect with --mock-data (Megatron's mock dataset splits 1,1,1)");
    if (d.source == DataSource::Builtin) warnings.push_back("--split has no effect with --builtin-data (each split is its own text)");
    d.split = f.get_string("split");
  } else if (f.given("data-path")) {
    warnings.push_back("Please specify --split when using --data-path. Using legacy default value \"969, 30, 1\"");
  }
  d.data_cache_path = f.get_string("data-cache-path");
  read_tokenizer_flags(f, d);
  d.eod_mask_loss = f.get_bool("eod-mask-loss");
  d.reset_position_ids = f.get_bool("reset-position-ids");
  d.reset_attention_mask = f.get_bool("reset-attention-mask");
  d.create_attention_mask = !f.get_bool("no-create-attention-mask-in-dataloader");
  d.mmap_bin_files = !f.get_bool("no-mmap-bin-files");
  d.num_workers = int(f.get_int("num-workers"));
  if (d.num_workers < 0) throw UserError("--num-workers must not be negative");
  const std::string loader = f.get_string("dataloader-type");
  if (loader == "external")
    throw UserError("--dataloader-type external is not supported by fp8tron: the dataset would have to be a Python data "
                    "loader; use single or cyclic");
  d.dataloader_type = loader == "cyclic" ? DataloaderType::Cyclic : DataloaderType::Single;
  d.data_sharding = !f.get_bool("no-data-sharding");
  if (!d.data_sharding && d.dataloader_type != DataloaderType::Cyclic)
    warnings.push_back("--no-data-sharding has no effect without --dataloader-type cyclic (as in Megatron)");
  d.fim = build_fim_config(f, warnings);

  if (d.source == DataSource::Builtin) {
    if (const std::string fim = fim_data_problem(d); !fim.empty()) throw UserError(fim);
    if (!d.tokenizer_defaulted && d.tokenizer_type != "NullTokenizer")
      throw UserError("--tokenizer-type " + d.tokenizer_type + " is not used by --builtin-data (its text has --vocab-size ids)");
    if (!d.null_vocab_size) throw UserError("--builtin-data needs --vocab-size");
    if (*d.null_vocab_size <= 1) throw UserError("--vocab-size must be at least 2");
    // fp8tron's own text: --vocab-size ids and one more for the end of a document (which the
    // synthetic text never contains), so its reference losses stay comparable across versions.
    d.tokenizer_type = "NullTokenizer";
    d.tokenizer_vocab_size = *d.null_vocab_size + 1;
    d.eod = -1;
    d.pad = -1;
    return d;
  }
  resolve_tokenizer_type(d, notices);
  if (const std::string fim = fim_data_problem(d); !fim.empty()) throw UserError(fim);
  if (d.tokenizer_type == "NullTokenizer") {
    if (!d.null_vocab_size) throw UserError("--tokenizer-type NullTokenizer needs --vocab-size");
    if (*d.null_vocab_size <= 1) throw UserError("--vocab-size must be at least 2");
    d.tokenizer_vocab_size = *d.null_vocab_size;
    d.eod = d.null_eod_id.value_or(*d.null_vocab_size - 1);
  } else {
    if (!tokenizer) throw UserError("--tokenizer-type " + d.tokenizer_type + " needs the trainer to build the tokenizer");
    TokenizerInfo info = tokenizer(d);
    d.tokenizer_vocab_size = info.vocab_size;
    d.eod = info.eod;
    d.pad = info.pad;
    warnings.insert(warnings.end(), info.warnings.begin(), info.warnings.end());
  }
  // Megatron's dataset ignores a pad id that collides with the end of a document.
  if (d.pad == d.eod) d.pad = -1;
  return d;
}

// Megatron's virtual-pipeline size: from --num-layers-per-virtual-pipeline-stage,
// --num-virtual-stages-per-pipeline-rank or the layout (at most one of them); 1 means no
// interleaving, not an error.
int virtual_stages(const FlagValues& f, const DistributedConfig& d, int pp) {
  const auto per_stage = f.opt_int("num-layers-per-virtual-pipeline-stage");
  const auto per_rank = f.opt_int("num-virtual-stages-per-pipeline-rank");
  const bool layout = !d.pipeline_layout.empty();
  if (int(bool(per_stage)) + int(bool(per_rank)) + int(layout) > 1)
    throw UserError("--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank and "
                    "--pipeline-model-parallel-layout cannot be combined; give one");
  if (layout) {
    if (d.pipeline_layout.size() % size_t(pp) != 0)
      throw UserError(strprintf("--pipeline-model-parallel-layout has %zu stages, not a multiple of "
                                "--pipeline-model-parallel-size (%d)",
                                d.pipeline_layout.size(), pp));
    return int(d.pipeline_layout.size()) / pp;
  }
  if (per_rank) {
    if (*per_rank <= 0) throw UserError("--num-virtual-stages-per-pipeline-rank must be positive");
    return int(*per_rank);
  }
  if (!per_stage) return 1;
  if (d.first_stage_layers || d.last_stage_layers)
    throw UserError("--decoder-first/last-pipeline-num-layers with a virtual pipeline: please use "
                    "--num-virtual-stages-per-pipeline-rank instead of --num-layers-per-virtual-pipeline-stage");
  const int64_t slots = f.get_int("num-layers") + int64_t(d.account_for_embedding) + int64_t(d.account_for_loss);
  if (*per_stage <= 0 || slots % pp != 0 || (slots / pp) % *per_stage != 0)
    throw UserError("--num-layers (with the embedding/loss slots of --account-for-*-in-pipeline-split) must be divisible "
                    "by --pipeline-model-parallel-size x --num-layers-per-virtual-pipeline-stage");
  return int(slots / pp / *per_stage);
}

DistributedConfig build_distributed(const FlagValues& f, const ParallelSizes& p) {
  DistributedConfig d;
  d.sequence_parallel = f.get_bool("sequence-parallel") && p.tp > 1;  // Megatron ignores SP without TP
  d.first_stage_layers = f.opt_int("decoder-first-pipeline-num-layers");
  d.last_stage_layers = f.opt_int("decoder-last-pipeline-num-layers");
  d.account_for_embedding = f.get_bool("account-for-embedding-in-pipeline-split");
  d.account_for_loss = f.get_bool("account-for-loss-in-pipeline-split");
  if (f.given("pipeline-model-parallel-layout")) {
    d.pipeline_layout = parse_pipeline_layout(f.get_string("pipeline-model-parallel-layout"));
    if (d.first_stage_layers || d.last_stage_layers || d.account_for_embedding || d.account_for_loss)
      throw UserError("--pipeline-model-parallel-layout cannot be set with other pipeline layout arguments "
                      "(--decoder-first/last-pipeline-num-layers, --account-for-embedding/loss-in-pipeline-split)");
  }
  if ((d.first_stage_layers || d.last_stage_layers) && (d.account_for_embedding || d.account_for_loss))
    throw UserError("--decoder-first/last-pipeline-num-layers cannot be combined with "
                    "--account-for-embedding/loss-in-pipeline-split");
  d.virtual_stages = virtual_stages(f, d, p.pp);
  d.overlap_p2p = !f.get_bool("no-overlap-p2p-communication");
  if (d.virtual_stages > 1 && p.pp < (d.overlap_p2p ? 2 : 3))
    throw UserError(d.overlap_p2p ? "an interleaved (virtual) pipeline needs --pipeline-model-parallel-size > 1"
                                  : "an interleaved (virtual) pipeline with --no-overlap-p2p-communication needs "
                                    "--pipeline-model-parallel-size > 2 (Megatron's rule)");
  d.microbatch_group_size = f.opt_int("microbatch-group-size-per-virtual-pipeline-stage").value_or(0);
  d.average_in_collective = f.get_bool("ddp-average-in-collective");
  d.distributed_optimizer = f.get_bool("use-distributed-optimizer") || f.get_string("optimizer") == "dist_muon";
  // Megatron-FSDP shards what its strategy says, through the distributed optimizer unless no_shard
  // (Megatron turns --use-distributed-optimizer on itself).
  d.dp_sharding = build_data_parallel_sharding(f);
  if (d.dp_sharding != DataParallelSharding::None) d.distributed_optimizer = d.dp_sharding != DataParallelSharding::NoShard;
  d.keep_params_after_forward = f.get_bool("torch-fsdp2-no-reshard-after-forward");
  d.optimizer_instances = int(f.get_int("num-distributed-optimizer-instances"));
  if (d.optimizer_instances < 1) throw UserError("--num-distributed-optimizer-instances must be at least 1");
  d.overlap_grad_reduce = f.get_bool("overlap-grad-reduce");
  d.overlap_param_gather = f.get_bool("overlap-param-gather");
  d.overlap_param_gather_with_optimizer_step = f.get_bool("overlap-param-gather-with-optimizer-step");
  d.bucket_numel = f.opt_int("ddp-bucket-size").value_or(std::max<int64_t>(40000000, 1000000 * int64_t(p.dp)));
  if (d.bucket_numel <= 0) throw UserError("--ddp-bucket-size must be positive");
  d.timeout_minutes = int(f.get_int("distributed-timeout-minutes"));
  if (d.timeout_minutes <= 0) throw UserError("--distributed-timeout-minutes must be positive");
  d.hang_report_seconds = int(f.get_int("hang-report-seconds"));
  if (d.hang_report_seconds <= 0) throw UserError("--hang-report-seconds must be positive");
  d.overlap_p2p_warmup_flush = f.get_bool("overlap-p2p-communication-warmup-flush");
  d.defer_embedding_wgrad = f.get_bool("defer-embedding-wgrad-compute");
  d.wgrad_deferral_limit = f.get_int("wgrad-deferral-limit");
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
  k.pretrained = f.get_string("pretrained-checkpoint");
  k.override_iteration = f.opt_int("override-ckpt-iteration");
  if (k.override_iteration && *k.override_iteration < 0) throw UserError("--override-ckpt-iteration must not be negative");
  if (k.override_iteration && k.finetune)
    throw UserError("--override-ckpt-iteration cannot be used with --finetune (Megatron's rule): --finetune starts "
                    "from iteration 0");
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
  k.exit_signal_handler_for_training = f.get_bool("exit-signal-handler-for-training");
  k.exit_signal_name = f.get_string("exit-signal");
  k.exit_signal = signal_number(k.exit_signal_name);
  k.ckpt_format = f.get_string("ckpt-format");
  k.auto_detect_ckpt_format = f.get_bool("auto-detect-ckpt-format");
  k.save_torch_dist = f.given("ckpt-format") && k.ckpt_format == "torch_dist" && !f.get_string("save").empty();
  k.convert_format = f.get_string("ckpt-convert-format");
  if (!k.convert_format.empty() && !f.get_string("ckpt-convert-save").empty()) {
    // As Megatron: args.save = os.path.join(args.ckpt_convert_save, args.ckpt_convert_format).
    k.save = f.get_string("ckpt-convert-save") + "/" + k.convert_format;
    k.save_torch_dist = k.convert_format == "torch_dist";
  }
  if (f.given("ckpt-format") && !f.get_string("save").empty() && !k.save_torch_dist)
    notices.push_back("--ckpt-format " + k.ckpt_format +
                      ": fp8tron writes its own checkpoint format (per-rank safetensors shards + one JSON metadata "
                      "file in Megatron's iter_NNNNNNN layout) for this value; only torch_dist is written in "
                      "Megatron's format; --load also reads Megatron's torch_dist and torch checkpoints");
  return k;
}

// Whether the pipeline chunk holding the MTP layers (the loss chunk) holds no decoder layer.
bool mtp_chunk_without_decoder_layers(const Config& c) {
  if (c.model.mtp.num_layers == 0) return false;
  const PipelineSplit split = pipeline_split(c);
  for (int r = 0; r < c.parallel.pp; ++r)
    for (const ChunkPlan& chunk : plan_pipeline_chunks(split, r))
      if (chunk.loss) return chunk.num_layers == 0;
  return false;
}

}  // namespace

PipelineSplit pipeline_split(const Config& c) {
  PipelineSplit p;
  p.num_layers = c.model.num_layers;
  p.pp = c.parallel.pp;
  p.chunks = c.distributed.virtual_stages;
  p.first_stage_layers = c.distributed.first_stage_layers;
  p.last_stage_layers = c.distributed.last_stage_layers;
  p.account_for_embedding = c.distributed.account_for_embedding;
  p.account_for_loss = c.distributed.account_for_loss;
  p.layout = c.distributed.pipeline_layout;
  return p;
}

int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tp) {
  const int64_t multiple = divisible_by * tp;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

Config build_config(const FlagValues& flags, const LaunchEnv& launch, bool gpu_available, const TokenizerResolver& tokenizer) {
  Config c;
  c.launch = launch;
  c.dry_run = flags.get_bool("dry-run");
  c.print_model_plan = flags.get_bool("print-model-plan");
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
  const DataWithVocab data = build_data(flags, tokenizer, c.notices, c.hint_warnings);
  c.data = data;
  c.model = build_model(flags, tp, data.tokenizer_vocab_size);
  c.model.recompute = build_recompute_config(flags, c.hint_warnings);
  c.model.offload = build_offload_config(flags, c.hint_warnings);
  c.context_parallel = build_context_parallel_config(flags);
  if (c.model.rotary.llama3_scaling && c.model.rotary.llama3_factor != 8.0)
    c.notices.push_back(strprintf("--rope-scaling-factor %g: fp8tron scales by it; Megatron's pretrain_gpt.py ignores the "
                                  "flag and always scales by 8",
                                  c.model.rotary.llama3_factor));
  c.model.moe = build_moe_config(flags, c.model, c.hint_warnings);
  c.model.mup = build_mup_config(flags, c.model);
  if (const MupConfig& u = c.model.mup; u.enabled)
    c.notices.push_back(strprintf("MuP: width multiplier %g (--hidden-size %lld / --mup-base-hidden-size %lld), embeddings x %g, "
                                  "logits x %g, attention softmax scale %g",
                                  u.width_mult, (long long)c.model.hidden_size, (long long)u.base_hidden_size,
                                  u.embedding_mult, u.output_mult, *u.softmax_scale));
  c.precision = build_precision(flags);
  c.model.params_dtype = c.precision.params_dtype;
  c.training = build_training(flags, c.parallel.dp);
  c.training.cuda_graph = build_cuda_graph_config(flags, c.hint_warnings);
  if (c.training.rampup)
    c.notices.push_back("--rampup-batch-size: the batch grows as in Megatron-LM before April 2026 (the newest Megatron-LM "
                        "deprecates the flag and trains at --global-batch-size from the start)");
  c.training.numerics = build_numerics(flags, c.precision, c.hint_warnings);
  c.training.rerun = build_rerun_config(flags, c.training.numerics, c.hint_warnings);
  c.training.iterations_to_skip = build_iterations_to_skip(flags, c.notices);
  c.optimizer = build_optimizer(flags);
  if (c.optimizer.precision_aware.enabled && c.optimizer.precision_aware.exp_avg_sq == StateDtype::Fp8)
    c.hint_warnings.push_back(
        "--exp-avg-sq-dtype fp8 keeps Adam's second moment in E4M3 with one scale per parameter: squared gradients "
        "below its largest / 2^18 become 0 and their updates large (a 1.3B GPT diverged within 10 steps); bf16 or "
        "fp16 second moments are the usual choice");
  if (c.model.mup.enabled) c.optimizer.mup_width_mult = c.model.mup.width_mult;
  for (auto& warning : mup_optimizer_warnings(c.model.mup, c.optimizer)) c.hint_warnings.push_back(std::move(warning));
  if (flags.get_string("optimizer") == "dist_muon")  // Megatron's warn_rank_0 in validate_args
    c.hint_warnings.push_back("optimizer='dist_muon' is deprecated. Use --optimizer muon --use-distributed-optimizer instead.");
  c.lr_schedule = build_lr_schedule(flags, c.optimizer, c.training, c.hint_warnings);

  c.logging.log_interval = flags.get_int("log-interval");
  c.logging.logging_level = resolve_logging_level(flags, [](const char* name) { return std::getenv(name); });
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
  c.logging.log_num_zeros_in_grad = flags.get_bool("log-num-zeros-in-grad");
  c.logging.wandb = WandbConfig{flags.get_string("wandb-project"), flags.get_string("wandb-exp-name"),
                                flags.get_string("wandb-entity"), flags.get_string("wandb-save-dir")};
  if (c.logging.wandb.save_dir.empty() && !c.checkpoint.save.empty()) c.logging.wandb.save_dir = c.checkpoint.save + "/wandb";

  c.device = flags.get_string("device");
  if (c.device.empty()) c.device = gpu_available ? "cuda" : "cpu";
  if (c.device == "cuda" && !gpu_available && !c.dry_run)
    throw UserError("--device cuda: no CUDA GPU is visible to this process (use --device cpu)");
  c.precision.fp8 = build_fp8(flags, c.model, c.precision, c.device == "cuda");
  c.precision.fp8.gemm_autotune =
      gemm_autotune_from_environment([](const char* name) { return std::getenv(name); }) && !c.training.deterministic;
  c.model.moe.expert_gemm_fp8 = c.precision.fp8.grouped_gemm_fp8;
  c.distributed.tp_overlap = build_tp_overlap(flags, tp, c.precision.fp8.enabled(), c.hint_warnings);

  settle_torch_dist_save(c);
  c.resolved_flags = resolved_flags(flags);
  validate_config(c, flags);
  c.model.mtp.chunk_without_decoder_layers = mtp_chunk_without_decoder_layers(c);
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
