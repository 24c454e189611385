// The one validated, immutable configuration, built once from flags + JSON by build_config().
// Sub-structs per domain; models/, parallel/, fp8/ and data/ take only the struct they need.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fp8/recipe.h"
#include "parallel/launch_env.h"
#include "parallel/topology.h"

namespace fp8tron {

enum class PositionEmbedding { LearnedAbsolute, Rope };
enum class Normalization { LayerNorm, RMSNorm };
enum class ParamDtype { Fp32, Bf16, Fp16 };
enum class DataSource { Builtin, Mock, Files };

struct ModelConfig {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t kv_channels = 0;        // per-head dimension
  int64_t num_query_groups = 0;   // == num_attention_heads without GQA
  int64_t seq_length = 0;
  int64_t max_position_embeddings = 0;
  PositionEmbedding position_embedding = PositionEmbedding::LearnedAbsolute;
  double rotary_base = 10000;
  double rotary_percent = 1.0;
  Normalization normalization = Normalization::LayerNorm;
  double norm_epsilon = 1e-5;
  bool apply_layernorm_1p = false;
  bool swiglu = false;
  bool add_bias_linear = true;
  bool add_qkv_bias = true;
  bool untie_embeddings_and_output_weights = false;
  double init_method_std = 0.02;
  double attention_dropout = 0.1;
  double hidden_dropout = 0.1;
  int64_t vocab_size = 0;         // the tokenizer's
  int64_t padded_vocab_size = 0;  // padded as Megatron pads it
  bool qk_layernorm = false;
  bool attention_softmax_in_fp32 = false;
  bool transformer_engine_modules = true;  // --transformer-impl
  ParamDtype params_dtype = ParamDtype::Fp32;
  uint64_t seed = 1234;  // initialisation seed
};

struct OptimizerConfig {
  std::string optimizer = "adam";  // adam (AdamW) | sgd
  double lr = 0;
  double min_lr = 0;
  double weight_decay = 0.01;
  double clip_grad = 1.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  double sgd_momentum = 0.9;
};

enum class DecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };
enum class WsdDecayStyle { Exponential, Linear, Cosine, MinusSqrt };
enum class WeightDecayIncrStyle { Constant, Linear, Cosine };

// Megatron's OptimizerParamScheduler; every "steps" count is in samples.
struct LrScheduleConfig {
  double init_lr = 0;  // --lr-warmup-init
  double max_lr = 0;
  double min_lr = 0;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;
  DecayStyle decay_style = DecayStyle::Linear;
  WsdDecayStyle wsd_decay_style = WsdDecayStyle::Exponential;
  int64_t wsd_decay_steps = 0;
  double start_wd = 0.01, end_wd = 0.01;
  int64_t wd_incr_steps = 0;
  WeightDecayIncrStyle wd_incr_style = WeightDecayIncrStyle::Constant;
};

// FP8 linear layers (--fp8-format and friends). Off when `recipe` is empty.
struct Fp8Config {
  std::optional<fp8::Recipe> recipe;
  bool tp_only_amax_reduction = false;  // --tp-only-amax-red: amaxes reduced over TP only, not TP x DP
  int64_t bf16_first_layers = 0;        // --first-last-layers-bf16 with --num-layers-at-start-in-bf16
  int64_t bf16_last_layers = 0;         //                             and --num-layers-at-end-in-bf16
  int64_t min_features = 0;             // --fp8-min-features: smaller linears stay bf16
  bool grouped_gemm_fp8 = true;         // !--no-use-gmm-fp8: TEGroupedLinear's use_fp8 (MoE experts)
  bool enabled() const { return recipe.has_value(); }
};

struct PrecisionConfig {
  ParamDtype params_dtype = ParamDtype::Fp32;
  Fp8Config fp8;
  bool grads_in_fp32 = true;                 // main gradients accumulate in fp32
  std::optional<double> static_loss_scale;   // --loss-scale
  double initial_loss_scale = 4294967296.0;
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool dynamic_loss_scale() const { return params_dtype == ParamDtype::Fp16 && !static_loss_scale; }
};

struct TrainingConfig {
  int64_t micro_batch_size = 0;
  int64_t global_batch_size = 0;
  int64_t num_micro_batches = 0;  // global / (micro * dp)
  int64_t train_iters = 0;
  std::optional<int64_t> train_samples;
  std::optional<int64_t> exit_interval;
  std::optional<int64_t> exit_duration_in_mins;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  uint64_t seed = 1234;
  bool deterministic = false;  // --deterministic-mode (trainer/determinism.h)
};

struct LoggingConfig {
  int64_t log_interval = 100;
  bool log_throughput = false;
  bool log_params_norm = false;
  int timing_log_level = 0;
  std::string timing_log_option = "minmax";
  std::string tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  bool log_all_ranks = false;
};

struct DataConfig {
  DataSource source = DataSource::Builtin;
  std::vector<std::string> data_path;  // [weight] prefix ... (--data-path)
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string split = "969, 30, 1";
  std::string data_cache_path;
  std::string tokenizer_type, vocab_file, merge_file, tokenizer_model;
  std::optional<int64_t> null_vocab_size;  // --vocab-size for the NullTokenizer
  int64_t eod = -1;                        // the tokenizer's end-of-document id (-1: none)
  bool eod_mask_loss = false, reset_position_ids = false, reset_attention_mask = false;
  int num_workers = 2;                     // batches prepared ahead by the loader thread
};

// How the model and its training are spread over ranks, beyond the rank grid itself.
struct DistributedConfig {
  bool sequence_parallel = false;
  int virtual_stages = 1;  // model chunks per pipeline rank (interleaved schedule when > 1)
  std::optional<int64_t> first_stage_layers, last_stage_layers;
  bool distributed_optimizer = false;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;  // needs distributed_optimizer and overlap_grad_reduce (Megatron)
  int64_t bucket_numel = 40000000;  // --ddp-bucket-size (Megatron: max(40M, 1M x dp) elements)
  int timeout_minutes = 10;
};

// Megatron's --save/--load family (trainer/checkpointing.h).
struct CheckpointConfig {
  std::string save, load;             // directories; "" = none
  std::optional<int64_t> save_interval;
  bool save_optim = true, save_rng = true;   // --no-save-optim, --no-save-rng
  bool load_optim = true, load_rng = true;   // --no-load-optim, --no-load-rng
  bool finetune = false;              // weights only, iteration and counters from 0
  bool load_main_params_from_ckpt = false;   // weights-only loads take the fp32 main weights
  std::optional<int64_t> ckpt_step;   // load this iteration instead of the tracker's
  bool exit_on_missing_checkpoint = false;
  bool async_save = false;            // write in the background (AsyncCheckpointSaver)
  // Megatron's default: the data-parallel replicas of a tensor are written in equal parts by the
  // data-parallel ranks; --no-ckpt-fully-parallel-save: data-parallel rank 0 writes them.
  bool fully_parallel_save = true;
  std::string dist_ckpt_strictness = "assume_ok_unexpected";  // tensor mismatches on load (Megatron's values)
  // Only the checkpoints of iterations that are multiples of this (and the latest) are kept.
  std::optional<int64_t> save_retain_interval;
  // Non-persistent checkpoints (Megatron's "global" type): every non_persistent_save_interval
  // iterations into non_persistent_dir, only the latest kept; loads take the newer of the two.
  std::optional<int64_t> non_persistent_save_interval;
  bool non_persistent_global = false;  // --non-persistent-ckpt-type global
  std::string non_persistent_dir;      // --non-persistent-global-ckpt-dir; "": <save or load>/non_persistent
  bool exit_signal_handler = false;   // save and exit at the next iteration on exit_signal
  int exit_signal = 15;               // SIGTERM
  std::string exit_signal_name = "SIGTERM";
};

struct Config {
  ModelConfig model;
  OptimizerConfig optimizer;
  LrScheduleConfig lr_schedule;
  PrecisionConfig precision;
  TrainingConfig training;
  LoggingConfig logging;
  DataConfig data;
  ParallelSizes parallel;
  DistributedConfig distributed;
  CheckpointConfig checkpoint;
  LaunchEnv launch;
  std::string device;      // "cpu" | "cuda"
  bool dry_run = false;
  // Flags that are recognised but whose feature has not landed, as "--flag (feature)"; training
  // refuses to start while any is set. --dry-run lists them.
  std::vector<std::string> not_supported_yet;
  // Hint-only flags that were given, as one-line warnings.
  std::vector<std::string> hint_warnings;
  // The resolved flags (name -> value text), printed by --dry-run and at start-up.
  std::vector<std::pair<std::string, std::string>> resolved_flags;
};

}  // namespace fp8tron
