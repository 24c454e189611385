// Named validation rules over the built configuration. Each rule is small and states one
// invariant; the message names the flags and says how to fix it.
#include <cmath>
#include <cstdlib>
#include <functional>

#include "core/error.h"
#include "core/text.h"
#include "parallel/layer_split.h"
#include "trainer/cli/config_builder.h"
#include "trainer/cli/context_parallel_args.h"
#include "trainer/cli/determinism_env.h"
#include "trainer/cli/recompute_args.h"

namespace fp8tron {
namespace {

struct Rule {
  const char* name;
  std::function<std::string(const Config&, const FlagValues&)> check;  // "" when satisfied
};

std::string ll(int64_t v) { return std::to_string(v); }

const std::vector<Rule>& rules() {
  static const std::vector<Rule> table = {
      {"query groups divide heads",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& m = c.model;
         if (m.num_query_groups <= 0) return "--num-query-groups must be positive";
         if (m.num_attention_heads % m.num_query_groups != 0)
           return "--num-attention-heads (" + ll(m.num_attention_heads) + ") is not divisible by --num-query-groups (" +
                  ll(m.num_query_groups) + ")";
         return "";
       }},
      {"tensor parallel divides heads and groups",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& m = c.model;
         if (m.num_attention_heads % c.parallel.tp != 0)
           return "--num-attention-heads (" + ll(m.num_attention_heads) + ") is not divisible by --tensor-model-parallel-size (" +
                  ll(c.parallel.tp) + ")";
         if (m.num_query_groups % c.parallel.tp != 0)
           return "--num-query-groups (" + ll(m.num_query_groups) + ") is not divisible by --tensor-model-parallel-size (" +
                  ll(c.parallel.tp) + ")";
         if (m.ffn_hidden_size % c.parallel.tp != 0)
           return "--ffn-hidden-size (" + ll(m.ffn_hidden_size) + ") is not divisible by --tensor-model-parallel-size (" +
                  ll(c.parallel.tp) + ")";
         return "";
       }},
      {"pipeline stages divide layers",
       [](const Config& c, const FlagValues& f) -> std::string {
         if (f.given("decoder-first-pipeline-num-layers") || f.given("decoder-last-pipeline-num-layers")) return "";
         if (c.model.num_layers % c.parallel.pp != 0)
           return "--num-layers (" + ll(c.model.num_layers) + ") is not divisible by --pipeline-model-parallel-size (" +
                  ll(c.parallel.pp) + "); use --decoder-first/last-pipeline-num-layers for uneven stages";
         return "";
       }},
      {"pipeline layout",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& d = c.distributed;
         try {
           for (int r = 0; r < c.parallel.pp; ++r)
             split_layers(c.model.num_layers, c.parallel.pp, r, d.virtual_stages, d.first_stage_layers, d.last_stage_layers);
         } catch (const UserError& e) {
           return e.what();
         }
         if (d.virtual_stages > 1 && c.training.num_micro_batches % c.parallel.pp != 0)
           return "the interleaved schedule needs the number of micro-batches (global / (micro x data-parallel)) to be a "
                  "multiple of --pipeline-model-parallel-size";
         return "";
       }},
      {"sequence parallel splits the sequence",
       [](const Config& c, const FlagValues&) -> std::string {
         if (c.distributed.sequence_parallel && c.model.seq_length % c.parallel.tp != 0)
           return "--seq-length (" + ll(c.model.seq_length) + ") is not divisible by --tensor-model-parallel-size (" +
                  ll(c.parallel.tp) + ") as --sequence-parallel needs";
         if (c.parallel.tp > 1 && c.model.padded_vocab_size % c.parallel.tp != 0)
           return "the padded vocabulary is not divisible by --tensor-model-parallel-size";
         return "";
       }},
      {"profiling",
       [](const Config& c, const FlagValues& f) -> std::string {
         const auto& p = c.profiling;
         if ((p.pytorch_profiler || p.record_shapes || f.given("profile-ranks")) && !p.enabled)
           return "--use-pytorch-profiler, --pytorch-profiler-collect-shapes and --profile-ranks need --profile";
         if (p.enabled && (p.step_start < 0 || p.step_end <= p.step_start))
           return "--profile-step-end (" + ll(p.step_end) + ") must be greater than --profile-step-start (" +
                  ll(p.step_start) + "), which must not be negative";
         if (p.pytorch_profiler && c.logging.tensorboard_dir.empty())
           return "--use-pytorch-profiler writes its trace to --tensorboard-dir (as Megatron's tensorboard_trace_handler); "
                  "give --tensorboard-dir";
         return "";
       }},
      {"collective backend",
       [](const Config&, const FlagValues& f) -> std::string {
         if (f.get_string("distributed-backend") == "gloo")
           return "--distributed-backend gloo is not available: fp8tron runs its collectives on NCCL on GPUs and on MPI "
                  "on CPUs (launch CPU jobs with mpirun); drop the flag";
         return "";
       }},
      {"positive sizes",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& m = c.model;
         if (m.ffn_hidden_size <= 0) return "--ffn-hidden-size must be positive";
         if (m.kv_channels <= 0) return "--kv-channels must be positive";
         if (m.seq_length <= 0) return "--seq-length must be positive";
         return "";
       }},
      {"positions cover the sequence",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& m = c.model;
         if (m.position_embedding == PositionEmbedding::LearnedAbsolute && m.max_position_embeddings < m.seq_length)
           return "--max-position-embeddings (" + ll(m.max_position_embeddings) + ") is smaller than --seq-length (" +
                  ll(m.seq_length) + ")";
         return "";
       }},
      {"rotary dimensions",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& m = c.model;
         if (m.rotary_percent <= 0 || m.rotary_percent > 1) return "--rotary-percent must be in (0, 1]";
         if (m.position_embedding == PositionEmbedding::Rope) {
           const double rot = m.kv_channels * m.rotary_percent;
           if (rot != std::floor(rot) || int64_t(rot) % 2 != 0)
             return "--kv-channels x --rotary-percent must be an even whole number of dimensions for rope";
         }
         return "";
       }},
      {"dropout probabilities",
       [](const Config& c, const FlagValues&) -> std::string {
         if (c.model.attention_dropout < 0 || c.model.attention_dropout >= 1) return "--attention-dropout must be in [0, 1)";
         if (c.model.hidden_dropout < 0 || c.model.hidden_dropout >= 1) return "--hidden-dropout must be in [0, 1)";
         return "";
       }},
      {"learning rates",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& s = c.lr_schedule;
         if (s.max_lr < 0 || s.min_lr < 0) return "--lr and --min-lr must not be negative";
         if (s.min_lr > s.max_lr) return "--min-lr is larger than --lr";
         if (s.decay_steps <= 0) return "the learning-rate decay span (--lr-decay-iters/-samples) must be positive";
         if (s.warmup_steps >= s.decay_steps && s.decay_style != DecayStyle::Constant)
           return "the warmup (--lr-warmup-*) must be shorter than the decay span (--lr-decay-iters/-samples)";
         if (s.decay_style == DecayStyle::WSD && (s.wsd_decay_steps <= 0 || s.wsd_decay_steps > s.decay_steps))
           return "--lr-wsd-decay-iters/-samples must be positive and within --lr-decay-iters/-samples";
         return "";
       }},
      {"optimizer settings",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& o = c.optimizer;
         if (o.clip_grad < 0) return "--clip-grad must not be negative (0 disables clipping)";
         if (o.weight_decay < 0) return "--weight-decay must not be negative";
         if (o.adam_beta1 < 0 || o.adam_beta1 >= 1 || o.adam_beta2 < 0 || o.adam_beta2 >= 1)
           return "--adam-beta1 and --adam-beta2 must be in [0, 1)";
         if (o.adam_eps <= 0) return "--adam-eps must be positive";
         return "";
       }},
      {"loss scaling",
       [](const Config& c, const FlagValues& f) -> std::string {
         const auto& p = c.precision;
         if (p.static_loss_scale && *p.static_loss_scale <= 0) return "--loss-scale must be positive";
         if (p.static_loss_scale && p.params_dtype != ParamDtype::Fp16) return "--loss-scale needs --fp16";
         if (p.initial_loss_scale <= 0 || p.min_loss_scale <= 0) return "--initial-loss-scale and --min-loss-scale must be positive";
         if (p.min_loss_scale > p.initial_loss_scale) return "--min-loss-scale is larger than --initial-loss-scale";
         if (p.loss_scale_window <= 0) return "--loss-scale-window must be positive";
         if (p.hysteresis <= 0) return "--hysteresis must be positive";
         if (f.given("accumulate-allreduce-grads-in-fp32") && p.params_dtype == ParamDtype::Fp32)
           return "--accumulate-allreduce-grads-in-fp32 needs --bf16 or --fp16";
         return "";
       }},
      {"expert parallelism needs experts",
       [](const Config& c, const FlagValues& f) -> std::string {
         // As Megatron-LM: expert parallelism splits the experts of a mixture-of-experts model.
         if (c.parallel.ep > 1 && !f.opt_int("num-experts").value_or(0))
           return "--expert-model-parallel-size " + ll(c.parallel.ep) +
                  " needs --num-experts (a mixture-of-experts model; fp8tron has none yet)";
         return "";
       }},
      {"overlapped data-parallel communication",
       [](const Config& c, const FlagValues&) -> std::string {
         // Megatron-LM's rules: the parameter all-gather exists only with the distributed
         // optimizer, and its buckets are those of the overlapped gradient reduction.
         const auto& d = c.distributed;
         if (d.overlap_param_gather && !d.distributed_optimizer)
           return "--overlap-param-gather is only supported with --use-distributed-optimizer";
         if (d.overlap_param_gather && !d.overlap_grad_reduce)
           return "--overlap-param-gather needs --overlap-grad-reduce";
         return "";
       }},
      {"deterministic mode environment",
       [](const Config& c, const FlagValues&) -> std::string {
         if (!c.training.deterministic || c.device != "cuda") return "";
         try {
           deterministic_environment([](const char* name) { return std::getenv(name); });
         } catch (const UserError& e) {
           return e.what();
         }
         return "";
       }},
      {"activation recomputation", recompute_problem},
      {"context parallelism", context_parallel_problem},
      {"intervals",
       [](const Config& c, const FlagValues&) -> std::string {
         if (c.logging.log_interval <= 0) return "--log-interval must be positive";
         if (c.training.eval_interval <= 0) return "--eval-interval must be positive";
         if (c.training.eval_iters < 0) return "--eval-iters must not be negative";
         if (c.training.exit_interval && *c.training.exit_interval <= 0) return "--exit-interval must be positive";
         if (c.logging.tensorboard_log_interval <= 0) return "--tensorboard-log-interval must be positive";
         return "";
       }},
  };
  return table;
}

}  // namespace

void validate_config(const Config& config, const FlagValues& flags) {
  for (const auto& rule : rules()) {
    std::string problem = rule.check(config, flags);
    if (!problem.empty()) throw UserError("invalid configuration (" + std::string(rule.name) + "): " + problem);
  }
}

}  // namespace fp8tron
