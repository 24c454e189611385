// Flags that do nothing in the combination given: a warning each, so a user who expects them to
// act learns at start-up that they do not (Megatron's own text where it warns, e.g. for
// --sequence-parallel without tensor parallelism). Each rule is one small check.
#include <functional>
#include <string>
#include <vector>

#include "core/text.h"
#include "trainer/cli/config_builder.h"

namespace fp8tron {
namespace {

// The given flags among `names`, as "--a, --b".
std::string given_among(const FlagValues& f, const std::vector<std::string>& names) {
  std::vector<std::string> given;
  for (const auto& n : names)
    if (f.given(n)) given.push_back("--" + n);
  return join(given, ", ");
}

using InertRule = std::function<std::string(const Config&, const FlagValues&)>;

const std::vector<InertRule>& inert_rules() {
  static const std::vector<InertRule> table = {
      [](const Config& c, const FlagValues& f) -> std::string {
        if (c.parallel.tp == 1 && f.get_bool("sequence-parallel"))
          return "Disabling sequence parallelism because tensor model parallelism is disabled";
        return "";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        if (c.precision.fp8.enabled()) return "";
        const std::string g = given_among(f, {"fp8-recipe", "fp8-margin", "fp8-interval", "fp8-amax-history-len",
                                              "fp8-amax-compute-algo", "tp-only-amax-red", "fp8-min-features",
                                              "first-last-layers-bf16", "num-layers-at-start-in-bf16",
                                              "num-layers-at-end-in-bf16", "no-use-gmm-fp8",
                                              "log-fp8-stats-to-tensorboard", "fp8-transposes", "no-fp8-wgrad",
                                              "disable-fp8-wgrad", "fp8-dot-product-attention"});
        return g.empty() ? "" : g + " ha" + (g.find(',') == std::string::npos ? "s" : "ve") +
                                    " no effect without --fp8-format (FP8 is off; --fp8-format e4m3 or hybrid turns it on)";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        if (!c.precision.fp8.enabled() || f.get_string("fp8-recipe") == "delayed") return "";
        const std::string g = given_among(f, {"fp8-margin", "fp8-interval", "fp8-amax-history-len", "fp8-amax-compute-algo"});
        return g.empty() ? "" : g + ": delayed-scaling settings, ignored with --fp8-recipe " + f.get_string("fp8-recipe");
      },
      [](const Config&, const FlagValues& f) -> std::string {
        if (f.get_bool("first-last-layers-bf16")) return "";
        const std::string g = given_among(f, {"num-layers-at-start-in-bf16", "num-layers-at-end-in-bf16"});
        return g.empty() ? "" : g + " ha" + (g.find(',') == std::string::npos ? "s" : "ve") +
                                    " no effect without --first-last-layers-bf16";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        if (!f.get_bool("grad-reduce-in-bf16")) return "";
        if (c.precision.params_dtype != ParamDtype::Bf16)
          return "--grad-reduce-in-bf16 has no effect without --bf16 (Megatron reads it only for bf16 runs)";
        if (f.get_bool("accumulate-allreduce-grads-in-fp32"))
          return "--accumulate-allreduce-grads-in-fp32 has no effect with --grad-reduce-in-bf16: gradients are "
                 "accumulated and reduced in bf16 (Megatron's rule)";
        return "";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        if (c.logging.wandb.enabled()) return "";
        const std::string g = given_among(f, {"wandb-exp-name", "wandb-entity", "wandb-save-dir"});
        return g.empty() ? "" : g + " ha" + (g.find(',') == std::string::npos ? "s" : "ve") +
                                    " no effect without --wandb-project (W&B logging is off)";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        if (c.precision.params_dtype == ParamDtype::Fp16) return "";
        const std::string g = given_among(f, {"initial-loss-scale", "min-loss-scale", "loss-scale-window", "hysteresis"});
        return g.empty() ? "" : g + ": loss scaling applies to --fp16 only; ignored";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        // Under context parallelism gradients and optimizer shards span data x context parallel.
        if (c.parallel.dp * c.parallel.cp > 1) return "";
        const std::string g = given_among(f, {"use-distributed-optimizer", "overlap-grad-reduce", "overlap-param-gather",
                                              "ddp-bucket-size", "num-distributed-optimizer-instances"});
        return g.empty() ? "" : g + ": nothing to shard or overlap with data-parallel size 1";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        if (!c.checkpoint.save.empty()) return "";
        const std::string g = given_among(f, {"save-interval", "persistent-save-interval", "save-retain-interval",
                                              "async-save", "no-save-optim", "no-save-rng", "non-persistent-save-interval"});
        return g.empty() ? "" : g + " ha" + (g.find(',') == std::string::npos ? "s" : "ve") + " no effect without --save";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        if (!c.checkpoint.load.empty()) return "";
        const std::string g = given_among(f, {"ckpt-step", "no-load-optim", "no-load-rng", "finetune",
                                              "load-main-params-from-ckpt", "exit-on-missing-checkpoint",
                                              "override-opt-param-scheduler", "override-opt_param-scheduler",
                                              "use-checkpoint-opt-param-scheduler", "use-checkpoint-opt_param-scheduler",
                                              "no-verify-integrity"});
        return g.empty() ? "" : g + " ha" + (g.find(',') == std::string::npos ? "s" : "ve") + " no effect without --load";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        if (c.distributed.defer_embedding_wgrad || !f.given("wgrad-deferral-limit")) return "";
        return "--wgrad-deferral-limit has no effect without --defer-embedding-wgrad-compute";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        if (c.checkpoint.exit_signal_handler || !f.given("exit-signal")) return "";
        return "--exit-signal has no effect without --exit-signal-handler";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        // Muon's scalar optimizer (the non-matrix parameters) is Adam.
        const bool adam = c.optimizer.optimizer == "adam" || c.optimizer.optimizer == "muon";
        const std::string g = adam ? given_among(f, {"sgd-momentum"}) : given_among(f, {"adam-beta1", "adam-beta2", "adam-eps"});
        return g.empty() ? "" : g + ": not used by --optimizer " + c.optimizer.optimizer;
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        // YaRN is a rotary embedding too, and multi-latent attention has its own rotary part.
        const PositionEmbedding pe = c.model.position_embedding;
        if (pe == PositionEmbedding::Rope || pe == PositionEmbedding::Yarn || c.model.mla.enabled) return "";
        const std::string g = given_among(f, {"rotary-base", "rotary-percent"});
        return g.empty() ? "" : g + ": rotary settings, ignored without --position-embedding-type rope or yarn";
      },
      [](const Config&, const FlagValues& f) -> std::string {
        if (f.get_bool("group-query-attention") || !f.given("num-query-groups")) return "";
        return "--num-query-groups has no effect without --group-query-attention";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        if (!c.logging.tensorboard_dir.empty()) return "";
        // W&B takes these scalars too, except the two Megatron writes to TensorBoard only.
        const std::string g =
            c.logging.wandb.enabled()
                ? given_among(f, {"log-validation-ppl-to-tensorboard", "log-memory-to-tensorboard"})
                : given_among(f, {"tensorboard-log-interval", "log-timers-to-tensorboard", "log-validation-ppl-to-tensorboard",
                                  "log-memory-to-tensorboard", "log-world-size-to-tensorboard", "log-fp8-stats-to-tensorboard"});
        return g.empty() ? "" : g + " ha" + (g.find(',') == std::string::npos ? "s" : "ve") +
                                    " no effect without --tensorboard-dir";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        if (c.parallel.cp > 1) return "";
        const std::string g = given_among(f, {"cp-comm-type", "hierarchical-context-parallel-sizes"});
        return g.empty() ? "" : g + " ha" + (g.find(',') == std::string::npos ? "s" : "ve") +
                                    " no effect without --context-parallel-size > 1";
      },
      [](const Config& c, const FlagValues& f) -> std::string {
        if (c.model.mup.enabled) return "";
        const std::string g = given_among(f, {"mup-width-mult", "mup-base-hidden-size", "mup-embedding-mult", "mup-output-mult",
                                              "mup-base-head-dim", "mup-attn-scale-power"});
        return g.empty() ? "" : g + " ha" + (g.find(',') == std::string::npos ? "s" : "ve") + " no effect without --use-mup";
      },
      [](const Config&, const FlagValues& f) -> std::string {
        if (!f.given("padded-vocab-size") || !f.given("make-vocab-size-divisible-by")) return "";
        return "--make-vocab-size-divisible-by has no effect with --padded-vocab-size";
      },
  };
  return table;
}

}  // namespace

std::vector<std::string> inert_flag_warnings(const Config& config, const FlagValues& flags) {
  std::vector<std::string> out;
  for (const auto& rule : inert_rules()) {
    std::string warning = rule(config, flags);
    if (!warning.empty()) out.push_back(std::move(warning));
  }
  return out;
}

}  // namespace fp8tron
