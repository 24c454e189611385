// Multi-process equivalence check, run under mpirun by ctest: every rank trains the tiny GPT (or
// the tiny mixture-of-experts GPT, with the MoE flags in the test's arguments) twice, once alone
// (the reference) and once in the parallel layout given on the command line, each from its own
// initialisation (nothing injected: the same seed gives bitwise the same initial weights in every
// layout, which is checked first), and compares the 10 losses (and the MoE and MTP losses), the 10
// gradient norms and its final (tensor-parallel-gathered) weights with the reference: losses within
// 1e-5 relative (fp32, dropout 0; `--tolerance X` for bf16 runs on GPUs), gradient norms within 10x
// the loss tolerance (the norm sums the squares of every gradient of every group: dense, expert,
// each pipeline stage's; a group counted twice or left out moves it by a large fraction, reduction
// orders by ~1e-7; `--grad-norm-tolerance X` where FP8 codes flip, which then also holds the
// non-bitwise --identical-* comparisons below), the MoE and MTP losses within the loss tolerance
// (`--aux-loss-tolerance X` where bf16 rounding of the router's logits moves the z-loss more),
// every tensor within 1e-2 of its own update (see the weights check; `--tensor-tolerance`,
// `--weights-tolerance` where a layout changes the rounding, each documented where it is passed).
// `--identical-without --flag` (repeatable) trains the layout a third time without that flag (and
// its value, for a valued flag) and requires bitwise-identical losses and weights (for flags that
// must not change the arithmetic, such as --overlap-param-gather: a weight used before its
// all-gather lands would show), unless `--without-tolerance` is given.
// `--identical-swapped --a --b` trains the layout once more with switch --a replaced by --b and
// requires bitwise-identical losses and weights (--use-ascend-mc2 and --tp-comm-overlap).
// `--identical-first-loss` keeps the first iteration's loss of those comparisons bitwise under
// `--without-tolerance`: for a flag whose forward is bitwise the run's without it and whose
// gradients are not (--moe-dispatch-fp8: fc1's weight gradients), the first loss is computed from
// the same weights by the same forward.
// `--without-tolerance T` relaxes both comparisons for runs whose arithmetic differs by design (GPU
// kernels and reduction orders; --fp8-param-gather's direct fp32-to-FP8 weight casts; the
// tensor-parallel overlap's split GEMMs, which the CPU's BLAS may round unlike the whole GEMM):
// losses within T relative, weights by the criteria used against one process (--weights-tolerance,
// and each tensor within --tensor-tolerance of its update) unless `--without-weights-tolerance W`
// and `--without-tensor-tolerance X` set tighter ones for this comparison.
// Each rank's exit status says whether it agrees; the launcher fails the job if any rank fails.
// Works under mpirun (CPU or GPU) and torchrun (GPU).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "parallel/launch_env.h"
#include "trainer/cli/config_builder.h"
#include "trainer/cli/flag_table.h"
#include "trainer/cli/flags.h"
#include "trainer/trainer.h"

using namespace fp8tron;

namespace {
std::vector<std::string> base_flags() {
  return {"--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
          "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "10", "--lr", "1e-3", "--vocab-size", "127", "--make-vocab-size-divisible-by", "32",
          "--builtin-data", "--attention-dropout", "0", "--hidden-dropout", "0", "--log-interval", "1000",
          "--eval-interval", "5", "--eval-iters", "1", "--device", "cpu", "--weight-decay", "0.1",
          "--distributed-timeout-minutes", "2"};
}

Config make_config(const std::vector<std::string>& extra, const LaunchEnv& env) {
  std::vector<std::string> args = {"fp8tron"};
  // A layout given in samples (--train-samples) replaces the base's --train-iters.
  const bool samples = std::find(extra.begin(), extra.end(), "--train-samples") != extra.end();
  const auto base = base_flags();
  for (size_t i = 0; i < base.size(); ++i) {
    if (samples && base[i] == "--train-iters") { ++i; continue; }
    args.push_back(base[i]);
  }
  for (const auto& a : extra) args.push_back(a);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return build_config(parse_command_line(int(argv.size()), argv.data()).values, env, cuda_available());
}

// Flags that change only the layout; the reference run gets every other flag too.
std::vector<std::string> without_layout_flags(const std::vector<std::string>& args) {
  // The token dispatcher counts as layout: the reference (one process) runs the default allgather
  // dispatcher, so a layout with --moe-token-dispatcher-type alltoall compares the two.
  static const std::set<std::string> layout = {
      "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
      "--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
      "--context-parallel-size", "--hierarchical-context-parallel-sizes", "--cp-comm-type",
      "--pipeline-model-parallel-layout", "--microbatch-group-size-per-virtual-pipeline-stage",
      "--tp-comm-overlap-cfg", "--coc-parallel-num", "--coc-mode", "--expert-model-parallel-size",
      "--expert-tensor-parallel-size", "--moe-token-dispatcher-type", "--wgrad-deferral-limit",
      "--num-distributed-optimizer-instances", "--data-parallel-sharding-strategy", "--outer-dp-sharding-strategy",
      "--megatron-fsdp-main-params-dtype", "--megatron-fsdp-main-grads-dtype", "--megatron-fsdp-grad-comm-dtype"};
  // The tensor-parallel overlap needs TP and SP, --fp8-param-gather the distributed optimizer, the
  // pipeline p2p flags and the deferred output-layer weight gradients a pipeline, the
  // expert-parallel overlap (and the weight gradients it holds) EP: one process runs without them.
  static const std::set<std::string> layout_switches = {
      "--sequence-parallel", "--use-distributed-optimizer", "--overlap-param-gather",
      "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split", "--tp-comm-overlap",
      "--disable-tp-comm-overlap-ag", "--disable-tp-comm-overlap-rs", "--disable-tp-comm-bulk-dgrad",
      "--disable-tp-comm-bulk-wgrad", "--no-tp-comm-overlap-ag", "--no-tp-comm-overlap-rs", "--no-tp-comm-bulk-dgrad",
      "--no-tp-comm-bulk-wgrad", "--tp-comm-overlap-rs-dgrad", "--tp-comm-overlap-disable-qkv",
      "--tp-comm-overlap-disable-fc1", "--use-ascend-mc2", "--use-ascend-coc", "--coc-fused-kernel",
      "--overlap-p2p-communication", "--no-overlap-p2p-communication", "--overlap-p2p-communication-warmup-flush",
      "--fp8-param-gather", "--distribute-saved-activations", "--defer-embedding-wgrad-compute",
      "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute", "--moe-dispatch-fp8",
      "--overlap-param-gather-with-optimizer-step", "--use-megatron-fsdp", "--use-torch-fsdp2",
      "--torch-fsdp2-no-reshard-after-forward"};
  // The routing map's padding for FP8 needs the alltoall dispatcher: the reference keeps it then.
  const bool router_padding = std::count(args.begin(), args.end(), "--moe-router-padding-for-fp8") +
                                  std::count(args.begin(), args.end(), "--moe-router-padding-for-quantization") >
                              0;
  // The precision-aware optimizer needs the distributed optimizer (Megatron's rule): the reference
  // keeps it, which on one process shards nothing.
  const bool precision_aware = std::count(args.begin(), args.end(), "--use-precision-aware-optimizer") > 0;
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (precision_aware && args[i] == "--use-distributed-optimizer") {
      out.push_back(args[i]);
      continue;
    }
    if (router_padding && args[i] == "--moe-token-dispatcher-type") {
      out.push_back(args[i]);
      continue;  // its value follows as an ordinary argument
    }
    if (layout.count(args[i])) {  // with its value(s)
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) ++i;
      continue;
    }
    if (!layout_switches.count(args[i])) out.push_back(args[i]);
  }
  return out;
}

// The worst relative difference of `other`'s gradient norms from `run`'s (0 when both are inf/nan,
// as in a skipped step; inf when only one is or the counts differ).
double worst_grad_norm_difference(const std::vector<double>& run, const std::vector<double>& other) {
  if (run.size() != other.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < run.size(); ++i) {
    if (!std::isfinite(run[i]) || !std::isfinite(other[i])) {
      if (std::isfinite(run[i]) != std::isfinite(other[i])) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::abs(other[i] - run[i]) / std::max(std::abs(run[i]), 1e-30));
  }
  return worst;
}

// Failures of `other` against `run`: bitwise (loss tolerance 0), or losses within `loss` relative,
// all weights within `weights` and each tensor within `tensor` of its update since `initial`. The
// measured differences are printed either way, so that a tolerance is chosen from figures.
struct Tolerances {
  double loss = 0, weights = 0, tensor = 0, grad_norm = 0;
  bool first_loss_bitwise = false;  // --identical-first-loss
};
int compare_runs(const TrainResult& run, const TrainResult& other, const Tolerances& tol,
                 const std::map<std::string, torch::Tensor>& initial, const std::string& what, int rank) {
  int failures = 0;
  const bool bitwise = tol.loss == 0;
  double worst_loss = 0;
  auto close = [&](double a, double b) {
    worst_loss = std::max(worst_loss, std::abs(a - b) / std::abs(b));
    return bitwise ? a == b : std::abs(a - b) <= tol.loss * std::abs(b);
  };
  bool losses_ok = run.losses.size() == other.losses.size();
  losses_ok = close(other.last_validation_loss, run.last_validation_loss) && losses_ok;
  for (size_t i = 0; i < run.losses.size() && i < other.losses.size(); ++i)
    losses_ok = close(other.losses[i], run.losses[i]) && losses_ok;
  if (!losses_ok) {
    std::fprintf(stderr, "[rank %d] losses differ %s\n", rank, what.c_str());
    ++failures;
  }
  if (tol.first_loss_bitwise && (run.losses.empty() || other.losses.empty() || run.losses[0] != other.losses[0])) {
    std::fprintf(stderr, "[rank %d] the first loss (the same weights' forward) differs %s: %.9g vs %.9g\n", rank,
                 what.c_str(), other.losses.empty() ? 0.0 : other.losses[0], run.losses.empty() ? 0.0 : run.losses[0]);
    ++failures;
  }
  const double grad_norms = worst_grad_norm_difference(run.grad_norms, other.grad_norms);
  if (!(grad_norms <= tol.grad_norm)) {
    std::fprintf(stderr, "[rank %d] gradient norms differ %s (%.2e relative)\n", rank, what.c_str(), grad_norms);
    ++failures;
  }
  double diff_sq = 0, ref_sq = 0, worst_ratio = 0;
  std::string worst_tensor;
  for (const auto& [name, w] : run.final_weights) {
    auto it = other.final_weights.find(name);
    bool same = it != other.final_weights.end() && it->second.sizes() == w.sizes();
    if (same) {
      const auto init = initial.find(name);
      const double moved = init == initial.end() ? w.norm().item<double>() : (w - init->second).norm().item<double>();
      const double ratio = (it->second - w).norm().item<double>() / std::max(moved, 1e-30);
      if (ratio > worst_ratio) { worst_ratio = ratio; worst_tensor = name; }
      same = bitwise ? torch::equal(w, it->second) : ratio <= tol.tensor;
      diff_sq += (it->second - w).pow(2).sum().item<double>();
      ref_sq += w.pow(2).sum().item<double>();
    }
    if (!same) {
      std::fprintf(stderr, "[rank %d] %s differs %s\n", rank, name.c_str(), what.c_str());
      ++failures;
    }
  }
  const double weights_rel = std::sqrt(diff_sq / std::max(ref_sq, 1e-30));
  if (!bitwise && !(weights_rel <= tol.weights)) {
    std::fprintf(stderr, "[rank %d] weights differ %s\n", rank, what.c_str());
    ++failures;
  }
  std::printf("[rank %d] %s: worst relative loss difference %.2e, gradient norm %.2e, weights %.2e, worst tensor %s "
              "at %.2e of its update%s\n", rank, what.c_str(), worst_loss, grad_norms, weights_rel, worst_tensor.c_str(),
              worst_ratio,
              bitwise && failures == 0 ? " (bitwise identical)" : "");
  return failures;
}

// --overlap-param-gather-with-optimizer-step must issue the first model chunk's parameter
// all-gathers while the optimizer step still runs (the run without the flag issues none then).
int check_param_gathers_during_step(const TrainResult& run, const TrainResult& plain, const std::set<std::string>& without,
                                    int rank) {
  if (!without.count("--overlap-param-gather-with-optimizer-step")) return 0;
  std::printf("[rank %d] parameter all-gather buckets issued during the optimizer step: %lld (without the flag: %lld)\n",
              rank, static_cast<long long>(run.param_gathers_during_step),
              static_cast<long long>(plain.param_gathers_during_step));
  if (run.param_gathers_during_step > 0 && plain.param_gathers_during_step == 0) return 0;
  std::fprintf(stderr, "[rank %d] the parameter all-gather did not start during the optimizer step\n", rank);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> layout;
    std::set<std::string> identical_without;
    std::optional<std::pair<std::string, std::string>> swapped;
    double without_tolerance = 0;  // 0: the --identical-* comparisons are bitwise
    bool identical_first_loss = false;
    // optim_grads_params: this rank must have held at most half of its weights at once, and of its
    // gradients; optim_grads (--expect-sharded-grads): at most half of its gradients.
    bool expect_sharded_weights = false, expect_sharded_grads = false;
    double tolerance = 1e-5;
    std::optional<double> weights_tolerance, tensor_tolerance, without_weights, without_tensor, grad_norm_tolerance,
        aux_loss_tolerance;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--tolerance" && i + 1 < argc) tolerance = std::stod(argv[++i]);
      else if (a == "--weights-tolerance" && i + 1 < argc) weights_tolerance = std::stod(argv[++i]);
      else if (a == "--tensor-tolerance" && i + 1 < argc) tensor_tolerance = std::stod(argv[++i]);
      else if (a == "--grad-norm-tolerance" && i + 1 < argc) grad_norm_tolerance = std::stod(argv[++i]);
      else if (a == "--aux-loss-tolerance" && i + 1 < argc) aux_loss_tolerance = std::stod(argv[++i]);
      else if (a == "--identical-without" && i + 1 < argc) identical_without.insert(argv[++i]);
      else if (a == "--identical-swapped" && i + 2 < argc) { swapped = {argv[i + 1], argv[i + 2]}; i += 2; }
      else if (a == "--without-tolerance" && i + 1 < argc) without_tolerance = std::stod(argv[++i]);
      else if (a == "--identical-first-loss") identical_first_loss = true;
      else if (a == "--without-weights-tolerance" && i + 1 < argc) without_weights = std::stod(argv[++i]);
      else if (a == "--without-tensor-tolerance" && i + 1 < argc) without_tensor = std::stod(argv[++i]);
      else if (a == "--expect-sharded-weights") expect_sharded_weights = expect_sharded_grads = true;
      else if (a == "--expect-sharded-grads") expect_sharded_grads = true;
      else layout.push_back(a);
    }
    const LaunchEnv env = read_launch_env();
    log::init(env.rank, false);
    LaunchEnv alone;  // the reference: one process, same flags minus the layout
    Config reference_config = make_config(without_layout_flags(layout), alone);
    Config parallel_config = make_config(layout, env);
    TrainOptions reference_options{.force_single_process = true, .collect_final_weights = true,
                                   .collect_initial_weights = true, .collect_grad_norms = true};
    TrainOptions parallel_options{.force_single_process = false, .collect_final_weights = true,
                                  .collect_initial_weights = true, .collect_grad_norms = true};
    TrainResult reference = train(reference_config, reference_options);
    TrainResult parallel = train(parallel_config, parallel_options);

    int failures = 0;
    // Layout-independent initialisation: every parameter this rank holds starts bitwise as in one process.
    for (const auto& [name, w] : parallel.initial_weights) {
      auto it = reference.initial_weights.find(name);
      if (it == reference.initial_weights.end() || !torch::equal(w, it->second)) {
        std::fprintf(stderr, "[rank %d] %s: initial value differs from one process's\n", env.rank, name.c_str());
        ++failures;
      }
    }
    for (size_t i = 0; i < reference.losses.size(); ++i) {
      const double rel = std::abs(parallel.losses.at(i) - reference.losses[i]) / std::abs(reference.losses[i]);
      if (!(rel <= tolerance)) {
        std::fprintf(stderr, "[rank %d] iteration %zu: loss %.8f vs reference %.8f (rel %.2e)\n", env.rank, i + 1,
                     parallel.losses[i], reference.losses[i], rel);
        ++failures;
      }
    }
    // The MoE losses (load_balancing_loss, z_loss, ...) and the multi-token-prediction losses are
    // reduced over the layout's groups to the same values as one process's.
    for (const auto* metrics : {&reference.moe_losses, &reference.mtp_losses})
      for (const auto& [name, values] : *metrics) {
        const auto& mine = metrics == &reference.moe_losses ? parallel.moe_losses : parallel.mtp_losses;
        auto it = mine.find(name);
        if (it == mine.end() || it->second.size() != values.size()) {
          std::fprintf(stderr, "[rank %d] metric %s missing\n", env.rank, name.c_str());
          ++failures;
          continue;
        }
        for (size_t i = 0; i < values.size(); ++i)
          if (!(std::abs(it->second[i] - values[i]) <= aux_loss_tolerance.value_or(tolerance) * std::max(std::abs(values[i]), 1.0))) {
            std::fprintf(stderr, "[rank %d] iteration %zu: %s %.8f vs reference %.8f\n", env.rank, i + 1, name.c_str(),
                         it->second[i], values[i]);
            ++failures;
          }
      }
    // The gradient norm before clipping, as logged: global over every group exactly once.
    const double grad_norm_rel = worst_grad_norm_difference(reference.grad_norms, parallel.grad_norms);
    if (reference.grad_norms.empty() || !(grad_norm_rel <= grad_norm_tolerance.value_or(10 * tolerance))) {
      std::fprintf(stderr, "[rank %d] gradient norms differ from one process's by %.2e relative\n", env.rank, grad_norm_rel);
      for (size_t i = 0; i < reference.grad_norms.size() && i < parallel.grad_norms.size(); ++i)
        std::fprintf(stderr, "[rank %d] iteration %zu: grad norm %.8g vs reference %.8g\n", env.rank, i + 1,
                     parallel.grad_norms[i], reference.grad_norms[i]);
      ++failures;
    }
    const double valid_rel = std::abs(parallel.last_validation_loss - reference.last_validation_loss) / reference.last_validation_loss;
    if (!(valid_rel <= tolerance)) {
      std::fprintf(stderr, "[rank %d] validation loss %.8f vs %.8f\n", env.rank, parallel.last_validation_loss, reference.last_validation_loss);
      ++failures;
    }
    // Weights, two measures.
    // 1. All of this rank's weights together: ||w - ref|| / ||ref|| within --weights-tolerance
    //    (default: the loss tolerance).
    // 2. Each tensor against how far training moved it in the reference run:
    //    ||w - ref|| / ||ref - init||. A wrong gradient on a single tensor (a missing tensor-parallel
    //    reduction, a gradient taken from the wrong shard) changes the direction of that tensor's
    //    updates and shows as a ratio of order 1 even when the tensor is tiny next to the rest;
    //    layout rounding noise moves it by far less. Default --tensor-tolerance: 1e-2 (fp32 layouts
    //    measure below 1e-3, the K part of the QKV bias included, whose true gradient is zero).
    if (parallel.final_weights.empty()) { std::fprintf(stderr, "[rank %d] holds no weights\n", env.rank); ++failures; }
    double diff_sq = 0, ref_sq = 0, worst_update_ratio = 0;
    std::string worst_tensor;
    for (const auto& [name, w] : parallel.final_weights) {
      auto it = reference.final_weights.find(name);
      if (it == reference.final_weights.end()) { std::fprintf(stderr, "[rank %d] unknown parameter %s\n", env.rank, name.c_str()); ++failures; continue; }
      if (w.sizes() != it->second.sizes()) { std::fprintf(stderr, "[rank %d] %s: shape differs\n", env.rank, name.c_str()); ++failures; continue; }
      const torch::Tensor& ref = it->second;
      diff_sq += (w - ref).pow(2).sum().item<double>();
      ref_sq += ref.pow(2).sum().item<double>();
      const double moved = (ref - reference.initial_weights.at(name)).norm().item<double>();
      const double ratio = (w - ref).norm().item<double>() / std::max(moved, 1e-30);
      if (ratio > worst_update_ratio) { worst_update_ratio = ratio; worst_tensor = name; }
      if (!(ratio <= tensor_tolerance.value_or(1e-2))) {
        std::fprintf(stderr, "[rank %d] %s: differs by %.2e of its update in the reference run\n", env.rank, name.c_str(), ratio);
        ++failures;
      }
    }
    const double weights_rel = std::sqrt(diff_sq / std::max(ref_sq, 1e-30));
    if (!(weights_rel <= weights_tolerance.value_or(tolerance))) { std::fprintf(stderr, "[rank %d] weights differ by %.2e relative\n", env.rank, weights_rel); ++failures; }
    const Tolerances without{
        without_tolerance,
        without_weights.value_or(weights_tolerance.value_or(std::max(without_tolerance, tolerance))),
        without_tensor.value_or(tensor_tolerance.value_or(1e-2)),
        without_tolerance > 0 ? grad_norm_tolerance.value_or(10 * without_tolerance) : 0.0, identical_first_loss};
    if (!identical_without.empty()) {
      std::vector<std::string> plain_layout;
      for (size_t i = 0; i < layout.size(); ++i) {
        if (!identical_without.count(layout[i])) { plain_layout.push_back(layout[i]); continue; }
        const FlagSpec* spec = find_flag(layout[i].substr(2));
        if (spec && spec->kind != FlagKind::Bool) ++i;  // a valued flag goes with its value
      }
      TrainResult plain = train(make_config(plain_layout, env), parallel_options);
      failures += compare_runs(parallel, plain, without, reference.initial_weights,
                               "from the run without the --identical-without flags", env.rank);
      failures += check_param_gathers_during_step(parallel, plain, identical_without, env.rank);
    }
    if (swapped) {
      // The same layout with one switch replaced by another that must mean the same run.
      std::vector<std::string> other = layout;
      for (auto& a : other)
        if (a == swapped->first) a = swapped->second;
      TrainResult alt = train(make_config(other, env), parallel_options);
      failures += compare_runs(parallel, alt, without, reference.initial_weights,
                               "with " + swapped->second + " instead of " + swapped->first, env.rank);
    }
    if (expect_sharded_grads) {
      // At most half of the weights (gathered) and of the gradients (held) at once. The gradients
      // follow the same units (parallel/sharded_grads.h); a unit kept whole for the step
      // (pipeline embedding copies, held weight gradients) counts from the start.
      auto at_most_half = [&](const char* what, const char* held, int64_t peak, int64_t all) {
        if (peak > 0 && 2 * peak <= all) {
          std::printf("[rank %d] sharded %s: at most %lld of %lld bytes %s at once\n", env.rank, what, (long long)peak,
                      (long long)all, held);
          return;
        }
        std::fprintf(stderr, "[rank %d] sharded %s: %lld of %lld bytes %s at once, expected at most half\n", env.rank,
                     what, (long long)peak, (long long)all, held);
        ++failures;
      };
      if (expect_sharded_weights)
        at_most_half("weights", "gathered", parallel.sharded_weights_peak_bytes, parallel.sharded_weights_total_bytes);
      at_most_half("gradients", "held", parallel.sharded_grads_peak_bytes, parallel.sharded_grads_total_bytes);
    }
    const int total = failures;
    {
      std::string joined;
      for (const auto& a : layout) joined += a + " ";
      double worst = 0;
      for (size_t i = 0; i < reference.losses.size(); ++i)
        worst = std::max(worst, std::abs(parallel.losses[i] - reference.losses[i]) / std::abs(reference.losses[i]));
      std::printf("[rank %d] %s: losses %.6f -> %.6f, worst relative loss difference %.2e, gradient norm %.2e (%.4g at "
                  "iteration 1), weights %.2e, worst tensor %s at %.2e of its update: %s\n", env.rank,
                  joined.c_str(), reference.losses.front(), reference.losses.back(), worst, grad_norm_rel,
                  reference.grad_norms.empty() ? 0.0 : reference.grad_norms.front(), weights_rel,
                  worst_tensor.c_str(), worst_update_ratio,
                  total > 0 ? "MISMATCH"
                  : without_tolerance > 0 && (swapped || !identical_without.empty()) && identical_first_loss
                      ? "equivalent to one process, and within --without-tolerance of the run without the flags (its first loss bitwise)"
                  : without_tolerance > 0 && (swapped || !identical_without.empty())
                      ? "equivalent to one process, and within --without-tolerance of the run without the flags / with the swapped one"
                  : !identical_without.empty() && swapped ? "equivalent to one process, bitwise identical without the flags and with the swapped one"
                  : !identical_without.empty()            ? "equivalent to one process, bitwise identical without the flags"
                  : swapped                               ? "equivalent to one process, bitwise identical with the swapped flag"
                                                          : "equivalent to one process");
    }
    return total == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parallel_equivalence: %s\n", e.what());
    return 2;
  }
}
