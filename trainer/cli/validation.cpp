// Named validation rules over the built configuration. Each rule is small and states one
// invariant; the message names the flags and says how to fix it.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "core/error.h"
#include "core/text.h"
#include "core/config/batch_schedule.h"
#include "fp8/recipe.h"
#include "parallel/layer_split.h"
#include "parallel/pipeline_layout.h"
#include "trainer/cli/config_builder.h"
#include "trainer/cli/context_parallel_args.h"
#include "trainer/cli/sharded_dp_args.h"
#include "trainer/cli/determinism_env.h"
#include "trainer/cli/cuda_graph_args.h"
#include "trainer/cli/offload_args.h"
#include "trainer/cli/recompute_args.h"
#include "trainer/cli/torch_dist_save_args.h"

namespace fp8tron {
namespace {

// Megatron's rules for Transformer Engine's precision-aware Adam (OptimizerConfig.__post_init__,
// get_megatron_optimizer, validate_args), plus refusals of what fp8tron does not implement.
std::string check_precision_aware_optimizer(const Config& c, const FlagValues& f) {
  const std::string flags[] = {"main-grads-dtype", "main-params-dtype", "exp-avg-dtype", "exp-avg-sq-dtype"};
  if (!c.optimizer.precision_aware.enabled) {
    for (const auto& flag : flags)
      if (f.get_string(flag) != "fp32")
        return "--" + flag + " " + f.get_string(flag) + " needs --use-precision-aware-optimizer (without it every "
               "optimizer state is fp32)";
    return "";
  }
  if (c.optimizer.optimizer != "adam")
    return "--use-precision-aware-optimizer supports --optimizer adam only (Megatron's rule), not " + c.optimizer.optimizer;
  if (!c.distributed.distributed_optimizer)
    return "--use-precision-aware-optimizer needs --use-distributed-optimizer (Megatron's rule)";
  for (const char* flag : {"main-params-dtype", "exp-avg-dtype", "exp-avg-sq-dtype"}) {
    const std::string v = f.get_string(flag);
    if ((v == "fp16" || v == "fp8") && c.distributed.overlap_param_gather_with_optimizer_step)
      return std::string("--") + flag + " " + v + " with --overlap-param-gather-with-optimizer-step is not supported: "
             "states scaled per parameter are updated one whole parameter at a time, that overlap cuts parameters "
             "(use bf16 or fp32 states, or drop the overlap)";
  }
  if (f.get_string("main-params-dtype") == "fp16") {
    if (c.precision.params_dtype == ParamDtype::Fp32)
      return "--main-params-dtype fp16 needs --bf16 or --fp16: fp32 model weights are their own main weights";
    if (f.get_bool("fp8-param-gather"))
      return "--main-params-dtype fp16 with --fp8-param-gather is not supported by fp8tron: its FP8 weights are cast "
             "from fp32 main weights (keep --main-params-dtype fp32)";
  }
  if (f.get_string("main-grads-dtype") == "bf16") {
    if (f.get_bool("accumulate-allreduce-grads-in-fp32"))
      return "--main-grads-dtype bf16 contradicts --accumulate-allreduce-grads-in-fp32 (Megatron's rule): drop one";
    if (c.precision.params_dtype != ParamDtype::Bf16)
      return "--main-grads-dtype bf16 needs --bf16 (other parameter dtypes keep their own gradient dtype)";
  }
  return "";
}

struct Rule {
  const char* name;
  std::function<std::string(const Config&, const FlagValues&)> check;  // "" when satisfied
};

std::string ll(int64_t v) { return std::to_string(v); }

// Which flag chose the tensor-parallel overlap ("" for none), for messages.
std::string overlap_flag(const FlagValues& f) {
  if (f.get_bool("tp-comm-overlap")) return "--tp-comm-overlap";
  if (f.get_bool("use-ascend-mc2")) return "--use-ascend-mc2";
  if (f.get_bool("use-ascend-coc")) return "--use-ascend-coc";
  return "";
}

// Tokens each tensor-parallel rank holds per micro-batch under sequence parallelism (of its
// context-parallel rank's share of the sequence), and how they are counted, for messages.
int64_t local_tokens(const Config& c) {
  return c.model.seq_length / std::max(1, c.parallel.cp) * c.training.micro_batch_size / std::max(1, c.parallel.tp);
}
std::string local_tokens_formula(const Config& c) {
  return std::string("(--seq-length") + (c.parallel.cp > 1 ? " / --context-parallel-size" : "") +
         " x --micro-batch-size / --tensor-model-parallel-size)";
}

// The split of a pipelined reduce-scatter (output columns = hidden size) or of CoC's all-gather
// pieces (tokens) must be whole, and FP8 chunks must be valid FP8 GEMM operands.
std::string check_overlap_split(const Config& c, TpGemm g) {
  const GemmOverlap& o = c.distributed.tp_overlap.gemm(g);
  if (o.method != OverlapMethod::kPipeline) return "";
  const bool coc = c.distributed.tp_overlap.source == TpOverlapSource::kCoc;
  // --tp-comm-overlap-cfg applies to --tp-comm-overlap only: MC2 always splits as TE's defaults do.
  const bool mc2 = c.distributed.tp_overlap.source == TpOverlapSource::kMc2;
  const std::string origin = mc2 ? " (--use-ascend-mc2 splits as Transformer Engine's defaults do, in 4)"
                                 : " (Transformer Engine's default is 4; --tp-comm-overlap-cfg sets it)";
  const std::string fewer_splits =
      mc2 ? "use --tp-comm-overlap with fewer splits (--tp-comm-overlap-cfg) or a larger --hidden-size" : "use fewer splits";
  const std::string what = coc ? "--coc-parallel-num " + ll(o.num_splits)
                               : std::string(tp_gemm_name(g)) + "'s pipeline num_splits " + ll(o.num_splits) + origin;
  const bool gathers = g == TpGemm::kQkvFprop || g == TpGemm::kFc1Fprop || g == TpGemm::kProjDgrad || g == TpGemm::kFc2Dgrad;
  const auto& fp8 = c.precision.fp8;
  if (gathers) {  // CoC pieces of each rank's tokens
    const int64_t rows = local_tokens(c);
    if (rows % o.num_splits != 0)
      return what + " does not divide the " + ll(rows) + " tokens each tensor-parallel rank holds " +
             local_tokens_formula(c) + "; pieces must be equal";
    if (fp8.enabled() && (rows / o.num_splits) % 16 != 0)
      return what + ": with FP8 each piece of " + ll(rows / o.num_splits) + " tokens is an FP8 GEMM operand and needs a "
             "multiple of 16 tokens; use fewer pieces or change --seq-length or --micro-batch-size";
    return "";
  }
  const int64_t cols = c.model.hidden_size;  // proj/fc2 outputs and qkv/fc1 dgrad outputs are hidden-wide
  if (cols % o.num_splits != 0)
    return what + " does not divide the hidden size " + ll(cols) + " (the output columns the pipeline splits)";
  if (fp8.enabled() && (cols / o.num_splits) % 16 != 0)
    return what + ": with FP8 each split of " + ll(cols / o.num_splits) + " columns is an FP8 GEMM operand and needs a "
           "multiple of 16; " + fewer_splits;
  if (fp8.enabled() && fp8::recipe_kind(*fp8.recipe) == fp8::RecipeKind::kBlockwise && (cols / o.num_splits) % 128 != 0)
    return what + ": with --fp8-recipe blockwise each split of " + ll(cols / o.num_splits) + " columns must hold whole "
           "128x128 weight blocks (a multiple of 128); " + fewer_splits + " or method ring_exchange";
  return "";
}

// Every overlapped GEMM's chunks for micro-batches of c.training.micro_batch_size sequences.
std::string check_overlap_chunk_shapes(const Config& c, const FlagValues& f) {
  const int64_t rows = local_tokens(c);
  if (c.precision.fp8.enabled() && rows % 16 != 0)
    return overlap_flag(f) + " with FP8: each rank's " + ll(rows) + " tokens " + local_tokens_formula(c) +
           " are multiplied in their own FP8 GEMM, which needs a multiple of 16; "
           "change --seq-length or --micro-batch-size";
  for (size_t i = 0; i < kNumTpGemms; ++i) {
    std::string problem = check_overlap_split(c, TpGemm(i));
    if (!problem.empty()) return problem;
  }
  return "";
}

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
      {"pipeline layout",
       [](const Config& c, const FlagValues&) -> std::string {
         // Every rank's chunks must be placeable (layer counts, embedding/loss slots, layout).
         try {
           if (!c.distributed.pipeline_layout.empty())
             validate_pipeline_layout(c.distributed.pipeline_layout, c.model.num_layers, c.model.mtp.num_layers, c.parallel.pp);
           for (int r = 0; r < c.parallel.pp; ++r) plan_pipeline_chunks(pipeline_split(c), r);
         } catch (const UserError& e) {
           return e.what();
         }
         return "";
       }},
      {"interleaved schedule micro-batches",
       [](const Config& c, const FlagValues&) -> std::string {
         // Megatron's forward_backward_pipelining_with_interleaving: with M micro-batches and
         // groups of N (--microbatch-group-size-per-virtual-pipeline-stage, default PP),
         // PP <= N <= M and M mod N is 0 or at least PP. Checked for every batch of a ramp-up and
         // for evaluation.
         const auto& d = c.distributed;
         if (d.virtual_stages <= 1) return "";
         const int64_t pp = c.parallel.pp, n = d.microbatch_group_size > 0 ? d.microbatch_group_size : pp;
         const auto& t = c.training;
         const BatchSchedule batches = BatchSchedule::of(t, c.parallel.dp);
         std::vector<int64_t> micro_batch_counts;
         for (int64_t batch : batches.running_batches()) micro_batch_counts.push_back(batch / (t.micro_batch_size * c.parallel.dp));
         if (t.eval_iters > 0) micro_batch_counts.push_back(t.eval_micro_batches);
         for (int64_t m : micro_batch_counts) {
           if (n < pp || n > m)
             return "the number of contiguous micro-batches in a virtual pipeline stage should range in [PP=" + ll(pp) +
                    ", M=" + ll(m) + "] (--microbatch-group-size-per-virtual-pipeline-stage " + ll(n) + ")";
           if (m % n != 0 && m % n < pp)
             return "the interleaved schedule needs the number of micro-batches (" + ll(m) + ") to be a multiple of " + ll(n) +
                    " (--microbatch-group-size-per-virtual-pipeline-stage, default --pipeline-model-parallel-size), or to "
                    "leave a remainder of at least --pipeline-model-parallel-size (" + ll(pp) + ")";
         }
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
      {"model plan",
       [](const Config& c, const FlagValues&) -> std::string {
         if (c.print_model_plan && c.dry_run)
           return "--print-model-plan builds the model, which --dry-run never does; give one of the two";
         return "";
       }},
      {"Weights & Biases",
       [](const Config& c, const FlagValues&) -> std::string {
         const WandbConfig& w = c.logging.wandb;
         if (!w.enabled()) return "";
         if (w.save_dir.empty())
           return "--wandb-project needs a directory for the run's files: give --wandb-save-dir, or --save (W&B then "
                  "writes under <--save>/wandb, as Megatron)";
         return "";
       }},
      {"collective backend",
       [](const Config&, const FlagValues& f) -> std::string {
         if (f.get_string("distributed-backend") == "gloo")
           return "--distributed-backend gloo is not available: fp8tron runs its collectives on NCCL on GPUs and on MPI "
                  "on CPUs (launch CPU jobs with mpirun); drop the flag";
         return "";
       }},
      {"MuP width multiplier",
       [](const Config& c, const FlagValues& f) -> std::string {
         // Megatron recomputes mup_width_mult from the hidden sizes whatever was given; a value that
         // disagrees with them is a mistake to name, not one to drop silently.
         const MupConfig& u = c.model.mup;
         if (!u.enabled || !f.given("mup-width-mult")) return "";
         const double given = f.get_float("mup-width-mult");
         if (std::abs(given - u.width_mult) <= 1e-12 * u.width_mult) return "";
         return strprintf("--mup-width-mult %g disagrees with --hidden-size / --mup-base-hidden-size = %lld / %lld = %g; "
                          "drop it (it is derived) or set --mup-base-hidden-size",
                          given, (long long)c.model.hidden_size, (long long)u.base_hidden_size, u.width_mult);
       }},
      {"positive sizes",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& m = c.model;
         if (m.ffn_hidden_size <= 0) return "--ffn-hidden-size must be positive";
         if (m.kv_channels <= 0) return "--kv-channels must be positive";
         if (m.seq_length <= 0) return "--seq-length must be positive";
         // Zero would start every weight at zero: the units of a layer stay identical and never learn apart.
         if (!(m.init_method_std > 0))
           return "--init-method-std must be positive (it is the initial weights' standard deviation; Megatron's "
                  "default is 0.02)";
         return "";
       }},
      {"end-of-document id inside the vocabulary",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& eod = c.data.null_eod_id;
         if (!eod || c.model.vocab_size <= 0 || (*eod >= 0 && *eod < c.model.vocab_size)) return "";
         return "--null-tokenizer-eod-id " + ll(*eod) + " is outside the vocabulary of " + ll(c.model.vocab_size) +
                " tokens; give an id below it or leave the flag out";
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
         if (m.position_embedding == PositionEmbedding::Yarn && m.kv_channels % 2 != 0)
           return "--kv-channels must be even for --position-embedding-type yarn (YaRN rotates every channel pair)";
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
      {"precision-aware optimizer", check_precision_aware_optimizer},
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
       [](const Config& c, const FlagValues&) -> std::string {
         // As Megatron-LM: expert parallelism splits a mixture-of-experts model's experts.
         const auto& moe = c.model.moe;
         if (c.parallel.ep > 1 && !moe.enabled())
           return "--expert-model-parallel-size " + ll(c.parallel.ep) + " needs --num-experts (a mixture-of-experts model)";
         if (moe.enabled() && moe.num_experts % c.parallel.ep != 0)
           return "--num-experts (" + ll(moe.num_experts) + ") is not divisible by --expert-model-parallel-size (" +
                  ll(c.parallel.ep) + ")";
         if (c.parallel.tp_pp_dp_order && c.parallel.pp > 1 && c.parallel.edp != c.parallel.dp)
           return "--use-tp-pp-dp-mapping with pipeline parallelism needs the expert data-parallel size (" +
                  ll(c.parallel.edp) + ") to equal the data-parallel size (" + ll(c.parallel.dp) +
                  "): choose --expert-model-parallel-size x --expert-tensor-parallel-size = --tensor-model-parallel-size";
         return "";
       }},
      {"MoE sizes",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& moe = c.model.moe;
         if (!moe.enabled()) return "";
         if (moe.num_moe_layers() == 0)
           return "--moe-layer-freq selects no layer: a mixture-of-experts model needs at least one MoE layer";
         if (moe.ffn_hidden_size <= 0) return "--moe-ffn-hidden-size must be positive";
         if (moe.ffn_hidden_size % c.parallel.etp != 0)
           return "--moe-ffn-hidden-size (" + ll(moe.ffn_hidden_size) + ") is not divisible by --expert-tensor-parallel-size (" +
                  ll(c.parallel.etp) + ")";
         if (moe.shared_expert_size % c.parallel.tp != 0)
           return "--moe-shared-expert-intermediate-size (" + ll(moe.shared_expert_size) +
                  ") is not divisible by --tensor-model-parallel-size (" + ll(c.parallel.tp) + ")";
         if (moe.topk < 1 || moe.topk > moe.num_experts)
           return "--moe-router-topk (" + ll(moe.topk) + ") must be between 1 and --num-experts (" + ll(moe.num_experts) + ")";
         return "";
       }},
      {"MoE with tensor parallelism needs sequence parallelism",
       [](const Config& c, const FlagValues&) -> std::string {
         // Megatron's MoELayer refuses to train so: the router and dispatcher work on sequence shards.
         if (c.model.moe.enabled() && c.parallel.tp > 1 && !c.distributed.sequence_parallel)
           return "a mixture-of-experts model with --tensor-model-parallel-size " + ll(c.parallel.tp) +
                  " needs --sequence-parallel";
         return "";
       }},
      {"MoE token dispatcher",
       [](const Config& c, const FlagValues& f) -> std::string {
         const auto& moe = c.model.moe;
         if (!moe.enabled()) return "";
         if (f.get_string("moe-token-dispatcher-type") == "flex")
           return "--moe-token-dispatcher-type flex (DeepEP/HybridEP) is not supported by fp8tron; use alltoall or allgather";
         if (moe.shared_expert_overlap && moe.dispatcher != MoeDispatcher::kAllToAll)
           return "--moe-shared-expert-overlap only works with --moe-token-dispatcher-type alltoall";
         if (moe.router_padding_for_quantization && moe.dispatcher != MoeDispatcher::kAllToAll)
           return "--moe-router-padding-for-quantization (--moe-router-padding-for-fp8) is not supported by the allgather "
                  "dispatcher; use --moe-token-dispatcher-type alltoall (FP8 experts pad their own inputs otherwise)";
         if (moe.router_padding_for_quantization && !c.precision.fp8.enabled())
           return "--moe-router-padding-for-quantization (--moe-router-padding-for-fp8) needs FP8 (--fp8-format)";
         return "";
       }},
      {"MoE biases",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& moe = c.model.moe;
         if (!moe.enabled() || !c.model.add_bias_linear) return "";
         if (moe.shared_expert_size > 0)
           return "--moe-shared-expert-intermediate-size needs --disable-bias-linear (the shared expert has no biases)";
         if (c.parallel.etp > 1)
           return "expert biases (no --disable-bias-linear) need --expert-tensor-parallel-size 1";
         return "";
       }},
      {"MoE router",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& moe = c.model.moe;
         if (!moe.enabled()) return "";
         const bool sinkhorn = moe.has_balancing(MoeBalancing::kSinkhorn);
         if (moe.enable_expert_bias && moe.score_function == MoeScoreFunction::kSoftmax)
           return "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid or sqrtsoftplus";
         if (moe.topk == 1 && moe.score_function == MoeScoreFunction::kSoftmax && !moe.pre_softmax && !sinkhorn)
           return "--moe-router-topk 1 with softmax scores needs --moe-router-pre-softmax (a softmax over one logit has "
                  "no gradient)";
         for (const auto& t : moe.balancing)
           if (t.type == MoeBalancing::kSinkhorn && t.coeff != 0)
             return "--moe-router-load-balancing-type sinkhorn needs --moe-aux-loss-coeff 0 for it";
         // Megatron routes with sinkhorn only when it is the one type given (in a list it is ignored).
         if (sinkhorn && moe.balancing.size() > 1)
           return "--moe-router-load-balancing-type sinkhorn cannot be combined with other types";
         if (moe.num_groups && *moe.num_groups <= 0) return "--moe-router-num-groups must be positive";
         if (moe.group_topk) {
           if (!moe.num_groups) return "--moe-router-group-topk needs --moe-router-num-groups";
           const int64_t groups = *moe.num_groups, chosen = *moe.group_topk;
           if (moe.num_experts % groups != 0)
             return "--num-experts (" + ll(moe.num_experts) + ") is not divisible by --moe-router-num-groups (" + ll(groups) + ")";
           if (chosen < 1 || chosen > groups)
             return "--moe-router-group-topk (" + ll(chosen) + ") must be between 1 and --moe-router-num-groups (" + ll(groups) + ")";
           if (moe.topk < chosen)
             return "--moe-router-topk (" + ll(moe.topk) + ") is smaller than --moe-router-group-topk (" + ll(chosen) +
                    "): every group would score 0";
           if (moe.topk / chosen > moe.num_experts / groups)
             return "--moe-router-topk / --moe-router-group-topk experts per group exceed the group size";
           if (moe.topk > chosen * (moe.num_experts / groups))
             return "--moe-router-topk (" + ll(moe.topk) + ") exceeds the experts of the selected groups";
         }
         return "";
       }},
      {"MoE capacity",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& moe = c.model.moe;
         if (!moe.enabled()) return "";
         if (moe.capacity_factor)
           for (const auto& t : moe.balancing)
             if (t.type == MoeBalancing::kSinkhorn)
               return "--moe-expert-capacity-factor only works with aux_loss, seq_aux_loss, global_aux_loss or none load "
                      "balancing";
         if (moe.pad_to_capacity && !moe.capacity_factor)
           return "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor";
         return "";
       }},
      {"overlapped data-parallel communication",
       [](const Config& c, const FlagValues&) -> std::string {
         // Megatron-LM's rules: the parameter all-gather exists only with the distributed
         // optimizer, and its buckets are those of the overlapped gradient reduction.
         const auto& d = c.distributed;
         if (d.overlap_param_gather && !d.distributed_optimizer && d.dp_sharding == DataParallelSharding::None)
           return "--overlap-param-gather is only supported with --use-distributed-optimizer";
         if (d.overlap_param_gather && !d.overlap_grad_reduce)
           return "--overlap-param-gather needs --overlap-grad-reduce";
         return "";
       }},
      {"parameter all-gather overlapped with the optimizer step",
       [](const Config& c, const FlagValues&) -> std::string {
         // Megatron-LM's assertions (arguments.py, optimizer/__init__.py), then fp8tron's own limit.
         const auto& d = c.distributed;
         if (!d.overlap_param_gather_with_optimizer_step) return "";
         if (!d.distributed_optimizer)
           return "--overlap-param-gather-with-optimizer-step only supported with distributed optimizer "
                  "(add --use-distributed-optimizer)";
         if (!d.overlap_param_gather)
           return "Must use --overlap-param-gather-with-optimizer-step with --overlap-param-gather";
         if (d.virtual_stages <= 1)
           return "--overlap-param-gather-with-optimizer-step only supported with interleaved pipeline parallelism "
                  "(add --num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank)";
         if (c.checkpoint.ckpt_format != "torch")
           return "--overlap-param-gather-with-optimizer-step not supported with distributed checkpointing yet "
                  "(Megatron): add --ckpt-format torch";
         if (c.optimizer.optimizer == "muon")
           return "--overlap-param-gather-with-optimizer-step is not supported with --optimizer muon and "
                  "--use-distributed-optimizer (Megatron's layer-wise distributed optimizer does not split the model "
                  "chunks): drop one of them";
         if (c.precision.fp8.param_gather)
           return "--overlap-param-gather-with-optimizer-step with --fp8-param-gather is not supported yet: fp8tron "
                  "casts every FP8 weight of a step in one pass after the whole update (drop one of them)";
         return "";
       }},
      {"distributed-optimizer instances",
       [](const Config& c, const FlagValues&) -> std::string {
         // Megatron-LM's rules (parallel_state.py, layer_wise_optimizer.py): the instances are
         // copies of the distributed optimizer, each over an equal block of the data-parallel x
         // context-parallel ranks and of the expert data-parallel ranks; the layer-wise (Muon)
         // distributed optimizer has a single instance.
         const int n = c.distributed.optimizer_instances;
         if (n == 1) return "";
         const std::string flag = "--num-distributed-optimizer-instances " + ll(n);
         if (!c.distributed.distributed_optimizer) return flag + " needs --use-distributed-optimizer";
         const int64_t dp_cp = int64_t(c.parallel.dp) * c.parallel.cp;
         if (dp_cp % n != 0)
           return flag + " must divide the data-parallel size x --context-parallel-size (" + ll(dp_cp) +
                  "): use a divisor of it";
         if (c.parallel.edp % n != 0)
           return flag + " must divide the expert data-parallel size (" + ll(c.parallel.edp) + "): use a divisor of it";
         if (c.optimizer.optimizer == "muon")
           return flag + " is not supported with --optimizer muon and --use-distributed-optimizer (Megatron's "
                         "layer-wise distributed optimizer has one instance): drop one of them";
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
      {"fine-grained activation offloading", offload_problem},
      {"CUDA graphs", cuda_graph_problem},
      {"context parallelism", context_parallel_problem},
      {"sharded data parallelism", sharded_data_parallel_problem},
      {"tensor-parallel overlap needs sequence parallelism",
       [](const Config& c, const FlagValues& f) -> std::string {
         const std::string flag = overlap_flag(f);
         const bool sp = c.distributed.sequence_parallel && c.parallel.tp > 1;
         if (flag.empty() || sp) return "";
         if (flag == "--tp-comm-overlap")
           return "--tp-comm-overlap: tensor parallel communication/GEMM overlap can happen only when sequence "
                  "parallelism is enabled (Megatron); add --sequence-parallel with --tensor-model-parallel-size > 1";
         if (flag == "--use-ascend-mc2")
           return "--use-ascend-mc2 requires both --tensor-model-parallel-size greater than 1 and --sequence-parallel "
                  "(MindSpeed)";
         return "--use-ascend-coc needs --sequence-parallel with --tensor-model-parallel-size > 1: fp8tron pipelines the "
                "sequence-parallel all-gather and reduce-scatter (MindSpeed's all-reduce variant without it is not "
                "implemented)";
       }},
      {"deterministic mode without tensor-parallel overlap",
       [](const Config& c, const FlagValues& f) -> std::string {
         // Megatron's apply_determinism_to_args (megatron/training/determinism.py) verifies
         // ARG_VALUES_REQUIRED_FOR_DETERMINISM and refuses, never switching an option off itself:
         // the user turns them off so the run matches the configuration asked for. MindSpeed's
         // mc2/coc run the same overlapped schedule as --tp-comm-overlap, so they count as it.
         if (!c.training.deterministic) return "";
         std::vector<std::string> mismatched;
         if (f.get_bool("cross-entropy-loss-fusion")) mismatched.push_back("cross_entropy_loss_fusion=False (got True)");
         const std::string flag = overlap_flag(f);
         if (!flag.empty()) mismatched.push_back("tp_comm_overlap=False (got True)");
         if (mismatched.empty()) return "";
         std::string fix;
         if (f.get_bool("cross-entropy-loss-fusion")) fix += "drop --cross-entropy-loss-fusion";
         if (!flag.empty())
           fix += (fix.empty() ? "drop " : " and ") + flag + (flag == "--tp-comm-overlap" ? "" : " (it runs the same overlapped schedule)");
         return "--deterministic-mode requires: " + join(mismatched, ", ") + " (Megatron); " + fix +
                ", or --deterministic-mode";
       }},
      {"deferred embedding weight gradients",
       [](const Config& c, const FlagValues&) -> std::string {
         // Megatron's ModelParallelConfig rules.
         const auto& d = c.distributed;
         if (!d.defer_embedding_wgrad) return "";
         if (c.parallel.pp == 1)
           return "Cannot defer embedding wgrad compute when pipeline model parallel is not used (Megatron): "
                  "--defer-embedding-wgrad-compute needs --pipeline-model-parallel-size > 1";
         if (!c.precision.gradient_accumulation_fusion)
           return "Cannot defer embedding wgrad compute when gradient accumulation fusion is not used (Megatron): drop "
                  "--no-gradient-accumulation-fusion or --defer-embedding-wgrad-compute";
         if (d.wgrad_deferral_limit < 0)
           return "--wgrad-deferral-limit must be >= 0 (0 defers every micro-batch's output-layer weight gradient)";
         return "";
       }},
      {"expert-parallel all-to-all overlap",
       [](const Config& c, const FlagValues& f) -> std::string {
         // Megatron's TransformerConfig rules for --overlap-moe-expert-parallel-comm, then what
         // fp8tron's combined schedule cannot run yet (refused by name, never ignored).
         if (!f.get_bool("overlap-moe-expert-parallel-comm")) return "";
         const std::string flag = "--overlap-moe-expert-parallel-comm";
         const auto& r = c.model.recompute;
         const bool virtual_pipeline = f.given("num-layers-per-virtual-pipeline-stage") ||
                                       f.given("num-virtual-stages-per-pipeline-rank") ||
                                       !c.distributed.pipeline_layout.empty();
         if (c.parallel.pp > 1 && !virtual_pipeline)
           return flag + ": with --pipeline-model-parallel-size > 1 a virtual pipeline must be specified (Megatron): add "
                  "--num-virtual-stages-per-pipeline-rank or --pipeline-model-parallel-layout";
         if (c.parallel.ep <= 1) return flag + " is only supported with expert model parallelism (--expert-model-parallel-size > 1)";
         if (c.model.moe.dispatcher != MoeDispatcher::kAllToAll)
           return flag + " is supported with the alltoall/flex token dispatcher (--moe-token-dispatcher-type alltoall)";
         if (r.full()) return flag + ": disable full recomputation (--recompute-granularity full)";
         if (r.method != RecomputeMethod::None) return flag + ": disable the recomputation method (--recompute-method)";
         if (f.given("recompute-num-layers")) return flag + ": --recompute-num-layers must not be given";
         if (r.selective(&RecomputeModules::moe)) return flag + ": disable moe in --recompute-modules";
         if (c.precision.params_dtype == ParamDtype::Fp32) return flag + " is only supported with --bf16 or --fp16";
         if (c.model.moe.shared_expert_overlap) return flag + ": disable --moe-shared-expert-overlap";
         if (c.model.mtp.num_layers > 1) return flag + ": MTP supports at most one layer (--mtp-num-layers 1)";
         if (f.get_string("cuda-graph-impl") == "transformer_engine") {
           auto scopes = f.get_list("cuda-graph-scope");
           for (const auto& m : f.get_list("cuda-graph-modules")) scopes.push_back(m);
           for (const auto& s : scopes)
             if (s == "moe" || s == "mlp")
               return flag + ": CUDA graph scope on moe and mlp is not supported with it (Megatron): drop " + s +
                      " from --cuda-graph-scope";
         }
         return "";
       }},
      {"MoE dispatch in FP8",
       [](const Config& c, const FlagValues& f) -> std::string {
         // fp8tron's own --moe-dispatch-fp8: what it needs, and the recipes whose casts are
         // per-tensor (one scale per expert over every rank's tokens), refused by name.
         if (!f.get_bool("moe-dispatch-fp8")) return "";
         const std::string flag = "--moe-dispatch-fp8";
         const auto& moe = c.model.moe;
         if (!moe.enabled()) return flag + " needs a mixture-of-experts model (--num-experts)";
         if (moe.dispatcher != MoeDispatcher::kAllToAll)
           return flag + " needs --moe-token-dispatcher-type alltoall (the allgather dispatcher gathers the tokens in "
                         "their dtype)";
         if (!c.precision.fp8.enabled())
           return flag + " needs FP8 experts: add --fp8-format with --fp8-recipe blockwise or mxfp8";
         if (!moe.expert_gemm_fp8) return flag + " needs FP8 experts: drop --no-use-gmm-fp8";
         const auto kind = fp8::recipe_kind(*c.precision.fp8.recipe);
         if (kind == fp8::RecipeKind::kDelayed)
           return flag + " supports the per-block recipes, --fp8-recipe blockwise or mxfp8, not delayed: a token's "
                         "per-tensor scale is its receiving expert's, which the sending rank does not hold";
         if (kind == fp8::RecipeKind::kTensorwise)
           return flag + " supports the per-block recipes, --fp8-recipe blockwise or mxfp8, not tensorwise: an "
                         "expert's per-tensor scale comes from the amax of its tokens from every rank, known only "
                         "after the dispatch";
         if (c.logging.log_fp8_stats_to_tensorboard)
           return flag + " with --log-fp8-stats-to-tensorboard is not supported: the experts' input casts run on the "
                         "ranks that send the tokens";
         return "";
       }},
      {"delayed weight gradients",
       [](const Config& c, const FlagValues& f) -> std::string {
         // Megatron's rules (arguments.py, TransformerConfig), then what fp8tron cannot hold yet.
         if (!f.get_bool("delay-wgrad-compute")) return "";
         const std::string flag = "--delay-wgrad-compute";
         if (!c.model.moe.overlap_expert_parallel_comm)
           return flag + ": overlap_moe_expert_parallel_comm must be enabled (Megatron): add "
                         "--overlap-moe-expert-parallel-comm";
         if (!c.model.transformer_engine_modules)
           return flag + " is only supported with the transformer_engine implementation (Megatron): use "
                         "--transformer-impl transformer_engine";
         if (f.get_bool("overlap-dispatch-backward-with-experts-wgrad"))
           return flag + " and --overlap-dispatch-backward-with-experts-wgrad are mutually exclusive (Megatron); use only "
                         "one";
         if (c.distributed.overlap_grad_reduce) {
           // Megatron: per-layer CUDA graphs that capture weight gradients (the attention's, or the
           // router's with a shared expert computed in the layer) need static gradient buffers.
           auto scopes = f.get_list("cuda-graph-scope");
           for (const auto& m : f.get_list("cuda-graph-modules")) scopes.push_back(m);
           const auto in_scope = [&](const char* s) { return std::find(scopes.begin(), scopes.end(), s) != scopes.end(); };
           const bool attn = in_scope("attn");
           if (attn || (in_scope("moe_router") && c.model.moe.shared_expert_size > 0 && !c.model.moe.shared_expert_overlap)) {
             if (!c.precision.gradient_accumulation_fusion)
               return flag + ": CUDA graph with delay_wgrad_compute requires gradient_accumulation_fusion (Megatron): "
                             "drop --no-gradient-accumulation-fusion";
             if (attn && (c.model.add_bias_linear || c.model.add_qkv_bias))
               return flag + ": CUDA graph with delay_wgrad_compute doesn't support attn bias (Megatron): add "
                             "--disable-bias-linear and drop --add-qkv-bias, or drop attn from --cuda-graph-scope";
           }
         }
         // fp8tron holds the weight gradients of its plain, FP8 and grouped linears; the
         // tensor-parallel overlap's communicating op computes its own.
         if (f.get_bool("tp-comm-overlap"))
           return flag + " with --tp-comm-overlap is not supported yet in fp8tron (the overlapped linears compute their "
                         "weight gradients inside the communicating op): drop one of them";
         return "";
       }},
      {"mc2 and coc without experts",
       [](const Config&, const FlagValues& f) -> std::string {
         if (!f.opt_int("num-experts").value_or(0)) return "";
         if (f.get_bool("use-ascend-mc2") || f.get_bool("use-ascend-coc"))
           return "--use-ascend-mc2/--use-ascend-coc: mc2/coc is not compatible with moe models (MindSpeed); use "
                  "--tp-comm-overlap, which leaves the experts' GEMMs unoverlapped as Megatron does";
         return "";
       }},
      {"tensor-parallel overlap beside the shared expert's side stream",
       [](const Config& c, const FlagValues& f) -> std::string {
         // --moe-shared-expert-overlap runs the shared expert (whose fc1/fc2 are overlapped
         // tensor-parallel linears) on a side stream while the token dispatch communicates: two
         // streams issuing collectives on different communicators in an order no rank agrees on.
         const std::string flag = overlap_flag(f);
         if (flag.empty() || !c.model.moe.shared_expert_overlap) return "";
         return flag + " with --moe-shared-expert-overlap is not supported by fp8tron: the shared expert's overlapped "
                "tensor-parallel linears cannot run on the side stream beside the token dispatch; drop one of them";
       }},
      {"tensor-parallel overlap chunk shapes",
       [](const Config& c, const FlagValues& f) -> std::string {
         const auto& plan = c.distributed.tp_overlap;
         if (!plan.enabled() || c.parallel.tp < 2) return "";
         std::string problem = check_overlap_chunk_shapes(c, f);
         if (!problem.empty() || c.training.eval_micro_batch_size == c.training.micro_batch_size) return problem;
         // Evaluation micro-batches run through the same overlapped linears.
         Config eval = c;
         eval.training.micro_batch_size = c.training.eval_micro_batch_size;
         problem = check_overlap_chunk_shapes(eval, f);
         if (problem.empty()) return "";
         return problem + " (in evaluation, with --eval-micro-batch-size " + ll(c.training.eval_micro_batch_size) + ")";
       }},
      {"FP8 weight gradients",
       [](const Config& c, const FlagValues&) -> std::string {
         if (!c.precision.fp8.enabled() || c.precision.fp8.wgrad) return "";
         if (c.model.moe.enabled() && c.model.moe.expert_gemm_fp8)
           return "--no-fp8-wgrad is not supported yet for the MoE experts' FP8 grouped GEMMs: add --no-use-gmm-fp8 "
                  "(experts in bf16) or drop --no-fp8-wgrad";
         if (c.distributed.tp_overlap.enabled())
           return "--no-fp8-wgrad is not supported yet with the tensor-parallel overlap (--tp-comm-overlap, "
                  "--use-ascend-mc2/coc): drop one of them";
         return "";
       }},
      {"FP8 attention",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& fp8 = c.precision.fp8;
         if (!fp8.enabled() || !fp8.dot_product_attention) return "";
         const auto& m = c.model;
         if (fp8::recipe_format(*fp8.recipe) == fp8::Fp8Format::kHiF8)
           return "--fp8-dot-product-attention needs --fp8-format e4m3 or hybrid (cuDNN's FP8 attention has no HiF8)";
         if (m.attention_dropout > 0)
           return "--fp8-dot-product-attention runs attention without dropout: add --attention-dropout 0";
         if (c.parallel.cp > 1)
           return "--fp8-dot-product-attention is not supported yet with context parallelism (--context-parallel-size " +
                  ll(c.parallel.cp) + ")";
         if (c.data.reset_attention_mask)
           return "--fp8-dot-product-attention takes plain causal attention: drop --reset-attention-mask";
         if (m.mla.enabled)
           return "--fp8-dot-product-attention is not supported yet with --multi-latent-attention";
         if (m.kv_channels % 16 != 0 || m.kv_channels > 256)
           return "--fp8-dot-product-attention needs a head dimension (--kv-channels, " + ll(m.kv_channels) +
                  ") that is a multiple of 16 and at most 256 (cuDNN's FP8 attention on Hopper)";
         return "";
       }},
      {"FP8 parameters",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& fp8 = c.precision.fp8;
         if (!fp8.param_gather) return "";
         if (!c.distributed.distributed_optimizer)
           return "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp, or inference "
                  "mode (Megatron): add --use-distributed-optimizer";
         const auto kind = fp8::recipe_kind(*fp8.recipe);
         if (kind == fp8::RecipeKind::kBlockwise || kind == fp8::RecipeKind::kMxfp8)
           return std::string("--fp8-param-gather with --fp8-recipe ") + fp8::recipe_kind_name(kind) +
                  " is not supported yet: fp8tron casts FP8 parameters with per-tensor scales (delayed, tensorwise)";
         if (fp8::recipe_format(*fp8.recipe) == fp8::Fp8Format::kHiF8)
           return "--fp8-param-gather with --fp8-format hif8 is not supported: HiF8 runs emulated (E4M3/E5M2 weights only)";
         return "";
       }},
      {"pipeline p2p overlap in warmup and flush",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& d = c.distributed;
         if (!d.overlap_p2p_warmup_flush || d.overlap_p2p) return "";
         return "Pipeline parallel communication overlapping in warmup and flush is only compatible with "
                "overlap_p2p_comm but not batch_p2p_comm (Megatron): --overlap-p2p-communication-warmup-flush needs "
                "the interleaved schedule (--num-layers-per-virtual-pipeline-stage) without "
                "--no-overlap-p2p-communication";
       }},
      {"intervals",
       [](const Config& c, const FlagValues&) -> std::string {
         if (c.logging.log_interval <= 0) return "--log-interval must be positive";
         if (c.training.eval_interval <= 0) return "--eval-interval must be positive";
         if (c.training.eval_iters < 0) return "--eval-iters must not be negative";
         if (c.training.exit_interval && *c.training.exit_interval <= 0) return "--exit-interval must be positive";
         if (c.logging.tensorboard_log_interval <= 0) return "--tensorboard-log-interval must be positive";
         return "";
       }},
      // ---- model variants, batch-size ramp-up, loss normalisation, optimizers ----
      {"squared ReLU",
       [](const Config& c, const FlagValues& f) -> std::string {
         if (!c.model.squared_relu) return "";
         if (c.model.swiglu) return "--squared-relu and --swiglu cannot be used together";
         // Megatron's bias_activation_fusion (on unless --disable-bias-linear or
         // --no-bias-gelu-fusion) only fuses gelu, swiglu and quick_geglu.
         if (c.model.add_bias_linear && !f.get_bool("no-bias-gelu-fusion"))
           return "--squared-relu needs --disable-bias-linear or --no-bias-gelu-fusion (Megatron's bias-activation fusion "
                  "supports only gelu, swiglu and quick_geglu)";
         return "";
       }},
      {"rotary variants",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& m = c.model;
         if (m.rotary.interleaved && m.mla.enabled) return "--rotary-interleaved cannot be used with --multi-latent-attention";
         if (m.rotary.interleaved && m.position_embedding == PositionEmbedding::Yarn)
           return "--rotary-interleaved cannot be used with --position-embedding-type yarn";
         if (m.rotary.llama3_scaling && m.rotary.llama3_factor <= 0) return "--rope-scaling-factor must be positive";
         if (m.rotary.yarn.scaling_factor <= 0) return "--rotary-scaling-factor must be positive";
         return "";
       }},
      {"attention output gate",
       [](const Config& c, const FlagValues&) -> std::string {
         if (c.model.attention_output_gate && c.model.mla.enabled)
           return "--attention-output-gate cannot be used with --multi-latent-attention (Megatron has no output gate for MLA)";
         return "";
       }},
      {"multi-latent attention",
       [](const Config& c, const FlagValues& f) -> std::string {
         const auto& m = c.model;
         const auto& a = m.mla;
         if (!a.enabled) {
           if (f.given("q-lora-rank") || f.given("kv-lora-rank") || f.given("qk-head-dim") || f.given("qk-pos-emb-head-dim") ||
               f.given("v-head-dim"))
             return "--q-lora-rank/--kv-lora-rank/--qk-head-dim/--qk-pos-emb-head-dim/--v-head-dim need --multi-latent-attention";
           return "";
         }
         if (f.get_bool("group-query-attention")) return "Group query attention is mutually exclusive with multi latent attention";
         if ((a.q_lora_rank && *a.q_lora_rank <= 0) || a.kv_lora_rank <= 0 || a.qk_head_dim <= 0 || a.qk_pos_emb_head_dim <= 0 ||
             a.v_head_dim <= 0)
           return "--q-lora-rank, --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim and --v-head-dim must be positive";
         if (a.qk_pos_emb_head_dim % 2 != 0) return "--qk-pos-emb-head-dim must be even (it is rotated in pairs)";
         return "";
       }},
      {"multi-token prediction",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& m = c.model;
         if (m.mtp.num_layers < 0) return "--mtp-num-layers must not be negative";
         if (m.mtp.num_layers == 0) return "";
         if (m.position_embedding == PositionEmbedding::Yarn)
           return "Multi-Token Prediction (MTP) is not supported with 'yarn' position embedding type (supported: "
                  "learned_absolute, rope, none)";
         // The MTP layers embed the shifted tokens on the loss stage; learned position embeddings
         // live only with the embedding.
         if (m.position_embedding == PositionEmbedding::LearnedAbsolute && c.parallel.pp > 1)
           return "--mtp-num-layers with learned absolute positions needs the embedding and the loss on one pipeline stage "
                  "(--pipeline-model-parallel-size 1); use --position-embedding-type rope or none with pipeline parallelism";
         // fp8tron runs the MTP layers in the pipeline stage that computes the loss.
         for (const auto& stage : c.distributed.pipeline_layout)
           if (stage.find('m') != std::string::npos && stage.find('L') == std::string::npos)
             return "--pipeline-model-parallel-layout: fp8tron runs the MTP layers m in the stage that holds the loss L; "
                    "put them together (e.g. \"...|mL\")";
         return "";
       }},
      {"batch-size ramp-up",
       [](const Config& c, const FlagValues&) -> std::string {
         const auto& t = c.training;
         if (!t.rampup && t.step_batch_schedule.empty()) return "";
         const int64_t micro_dp = t.micro_batch_size * c.parallel.dp;
         const BatchSchedule batches = BatchSchedule::of(t, c.parallel.dp);
         for (int64_t batch : batches.running_batches()) {
           if (batch <= 0)
             return "--rampup-batch-size / --step-batch-size-schedule: a batch is smaller than --micro-batch-size x data-parallel size (" +
                    ll(micro_dp) + ")";
           // A step schedule's entries are checked when they apply (Megatron: early entries may
           // predate a scale-up of the data-parallel size).
           if (batch % micro_dp != 0 && t.step_batch_schedule.empty())
             return "current global batch size (" + ll(batch) + ") is not divisible by micro-batch-size (" +
                    ll(t.micro_batch_size) + ") times data parallel size (" + ll(c.parallel.dp) +
                    ") (--rampup-batch-size, --step-batch-size-schedule; with the ramp-up --decrease-batch-size-if-needed "
                    "rounds it down)";
         }
         return "";
       }},
      {"per-token loss",
       [](const Config& c, const FlagValues&) -> std::string {
         if (c.training.calculate_per_token_loss && c.distributed.average_in_collective)
           return "--calculate-per-token-loss cannot be combined with --ddp-average-in-collective (the gradients are "
                  "divided by the global token count instead)";
         return "";
       }},
      {"Muon optimizer",
       [](const Config& c, const FlagValues&) -> std::string {
         if (c.optimizer.optimizer != "muon") return "";
         if (c.precision.params_dtype == ParamDtype::Fp16) return "--optimizer muon does not support --fp16 (as in Megatron); use --bf16";
         // With --use-distributed-optimizer Muon's matrices are distributed whole over the data-parallel
         // ranks (Megatron's layer-wise distributed optimizer); FP8 parameters are not part of that path.
         if (c.distributed.distributed_optimizer && c.precision.fp8.param_gather)
           return "--fp8-param-gather with --optimizer muon is not supported by fp8tron: Muon orthogonalises the "
                  "bf16/fp32 weights and its distributed optimizer gathers them whole (drop --fp8-param-gather)";
         return "";
       }},
      {"checkpoint conversion",
       [](const Config& c, const FlagValues& f) -> std::string {
         const CheckpointConfig& k = c.checkpoint;
         if (k.convert_format.empty()) return f.given("ckpt-convert-save") ? "--ckpt-convert-save needs --ckpt-convert-format" : "";
         if (k.convert_format != "torch_dist")
           return "--ckpt-convert-format " + k.convert_format + ": fp8tron converts into Megatron's torch_dist format "
                  "only; pass --ckpt-convert-format torch_dist";
         if (!f.given("ckpt-convert-save")) return "--ckpt-convert-format needs --ckpt-convert-save (the directory to write)";
         if (k.load.empty()) return "--ckpt-convert-format needs --load (the checkpoint to convert)";
         return "";
       }},
      {"saving Megatron's torch_dist format",
       [](const Config& c, const FlagValues&) -> std::string {
         // What fp8tron writes in Megatron's names today (checkpoint/save_torch_dist.h); the rest
         // would need Megatron's other optimizer and model layouts. (A plain --save falls back to
         // fp8tron's format: settle_torch_dist_save; a conversion is refused.)
         if (!c.checkpoint.save_torch_dist) return "";
         const std::string flag = torch_dist_unwritable_flag(c);
         if (flag.empty()) return "";
         return flag + " with --ckpt-convert-format torch_dist is not supported yet (fp8tron writes Megatron's "
                       "torch_dist for GPT and MoE models with local layers and Adam, without FP8, Megatron-FSDP, "
                       "MTP or MLA)";
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
