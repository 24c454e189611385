// Multi-process checkpoint test, run under mpirun by ctest. Every rank:
//   1. trains the tiny GPT 20 iterations straight in the save layout (the reference losses), and
//      20 iterations alone (single process: the reference weights);
//   2. trains 10 iterations in the save layout and saves (on --exit-interval 10);
//   3. for each load layout: loads that checkpoint into a fresh trainer and trains to 20.
// With --exact (load layout = save layout) the resumed losses and final weights must be bitwise
// those of the straight run. Otherwise (resharding) every resumed loss must match the straight
// run's within 1e-5 relative, and the weights the single-process run's (same criteria as
// parallel_equivalence: 1e-5 overall, each tensor within 1e-2 of its own update). Each rank's exit status says whether it agrees.
//
//   fp8tron_checkpoint_resume --dir D --save tp=2,pp=2 --load single --load tp=4 [--exact]
//                             [--files-with-weights N] [model flags]
// Layout specs: comma-separated tp=N, pp=N, cp=N, vpp=N (layers per virtual stage), sp, distopt,
// instances=N (distributed-optimizer instances), ep=N, etp=N
// (expert and expert tensor parallelism), alltoall (the MoE dispatcher), fsdp[=STRATEGY]
// (--use-megatron-fsdp, by default optim_grads_params), dp (data parallel over the
// remaining ranks, as always; a spec of its own); "single" trains in one
// process on every rank. --files-with-weights N: the saved checkpoint must hold model weights in
// N shard files (data-parallel ranks share the writing of replicas unless
// --no-ckpt-fully-parallel-save).
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "parallel/launch_env.h"
#include "checkpoint/file_io.h"
#include "checkpoint/metadata.h"
#include "trainer/cli/config_builder.h"
#include "trainer/cli/flags.h"
#include "trainer/trainer.h"

using namespace fp8tron;

namespace {
std::vector<std::string> base_flags() {
  return {"--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
          "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "20", "--lr", "1e-3",
          "--vocab-size", "127", "--make-vocab-size-divisible-by", "32", "--builtin-data", "--attention-dropout", "0",
          "--hidden-dropout", "0", "--log-interval", "1000", "--eval-interval", "5", "--eval-iters", "1",
          "--device", "cpu", "--weight-decay", "0.1", "--distributed-timeout-minutes", "2"};
}

struct Layout {
  std::string spec;
  std::vector<std::string> flags;
  bool single = false;
};

Layout parse_layout(const std::string& spec) {
  Layout l{spec, {}, false};
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "tp") l.flags.insert(l.flags.end(), {"--tensor-model-parallel-size", value});
    else if (key == "pp") l.flags.insert(l.flags.end(), {"--pipeline-model-parallel-size", value});
    else if (key == "cp") l.flags.insert(l.flags.end(), {"--context-parallel-size", value});
    else if (key == "vpp") l.flags.insert(l.flags.end(), {"--num-layers-per-virtual-pipeline-stage", value});
    else if (key == "sp") l.flags.push_back("--sequence-parallel");
    else if (key == "distopt") l.flags.push_back("--use-distributed-optimizer");
    else if (key == "fsdp") {  // Megatron-FSDP; fsdp=STRATEGY, default optim_grads_params
      l.flags.push_back("--use-megatron-fsdp");
      if (!value.empty()) l.flags.insert(l.flags.end(), {"--data-parallel-sharding-strategy", value});
    }
    else if (key == "instances") l.flags.insert(l.flags.end(), {"--num-distributed-optimizer-instances", value});
    else if (key == "ep") l.flags.insert(l.flags.end(), {"--expert-model-parallel-size", value});
    else if (key == "etp") l.flags.insert(l.flags.end(), {"--expert-tensor-parallel-size", value});
    else if (key == "alltoall") l.flags.insert(l.flags.end(), {"--moe-token-dispatcher-type", "alltoall"});
    else if (key == "single") l.single = true;
    else if (key == "dp") continue;
    else throw UserError("unknown layout item '" + item + "' in " + spec);
  }
  return l;
}

Config make_config(const std::vector<std::string>& model, const Layout& layout, const std::vector<std::string>& extra,
                   const LaunchEnv& env) {
  const std::vector<std::string> base = base_flags();
  std::vector<std::string> args = {"fp8tron"};
  for (const auto* part : {&base, &model, &layout.flags, &extra}) args.insert(args.end(), part->begin(), part->end());
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return build_config(parse_command_line(int(argv.size()), argv.data()).values, layout.single ? LaunchEnv{} : env,
                      cuda_available());
}

TrainResult run(const std::vector<std::string>& model, const Layout& layout, const std::vector<std::string>& extra,
                const LaunchEnv& env) {
  return train(make_config(model, layout, extra, env),
               TrainOptions{.force_single_process = layout.single, .collect_final_weights = true,
                            .collect_initial_weights = true});
}

struct Checker {
  int rank;
  int failures = 0;
  void fail(const std::string& message) {
    std::fprintf(stderr, "[rank %d] %s\n", rank, message.c_str());
    ++failures;
  }
};
}  // namespace

int main(int argc, char** argv) {
  try {
    std::string dir;
    Layout save;
    std::vector<Layout> loads;
    std::vector<std::string> model;
    bool exact = false;
    int files_with_weights = 0;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--dir" && i + 1 < argc) dir = argv[++i];
      else if (a == "--files-with-weights" && i + 1 < argc) files_with_weights = std::stoi(argv[++i]);
      else if (a == "--save" && i + 1 < argc) save = parse_layout(argv[++i]);
      else if (a == "--load" && i + 1 < argc) loads.push_back(parse_layout(argv[++i]));
      else if (a == "--exact") exact = true;
      else model.push_back(a);
    }
    if (dir.empty() || save.spec.empty() || loads.empty()) throw UserError("usage: --dir D --save LAYOUT --load LAYOUT...");
    const LaunchEnv env = read_launch_env();
    log::init(env.rank, false);
    Checker check{env.rank};
    // Rank 0 clears the directory before its first collective; the others touch it only later.
    if (env.rank == 0) checkpoint::remove_tree(dir);

    const TrainResult straight = run(model, save, {}, env);
    const TrainResult alone = exact ? TrainResult{} : run(model, Layout{"single", {}, true}, {}, env);
    const TrainResult first = run(model, save, {"--exit-interval", "10", "--save", dir}, env);
    if (std::vector<double>(straight.losses.begin(), straight.losses.begin() + 10) != first.losses)
      check.fail(save.spec + ": the first 10 iterations differ from the straight run");
    if (files_with_weights > 0 && env.rank == 0) {
      std::set<std::string> files;
      for (const auto& [name, tensor] : checkpoint::read_metadata(dir + "/iter_0000010").tensors)
        if (name.rfind("optimizer.", 0) != 0)
          for (const auto& shard : tensor.shards) files.insert(shard.file);
      if (int(files.size()) != files_with_weights)
        check.fail(strprintf("the model weights are in %zu shard files, expected %d", files.size(), files_with_weights));
    }

    for (const Layout& load : loads) {
      const TrainResult resumed = run(model, load, {"--load", dir}, env);
      const std::string what = save.spec + " -> " + load.spec;
      if (resumed.losses.size() != 10) {
        check.fail(strprintf("%s: %zu iterations after loading, expected 10", what.c_str(), resumed.losses.size()));
        continue;
      }
      double worst = 0;
      for (size_t i = 0; i < 10; ++i) {
        const double ref = straight.losses[10 + i], got = resumed.losses[i];
        const double rel = std::abs(got - ref) / std::abs(ref);
        worst = std::max(worst, rel);
        if (exact ? got != ref : !(rel <= 1e-5))
          check.fail(strprintf("%s: iteration %zu loss %.9f vs %.9f straight", what.c_str(), 11 + i, got, ref));
      }
      double diff_sq = 0, ref_sq = 0;
      const auto& reference = exact ? straight.final_weights : alone.final_weights;
      if (resumed.final_weights.empty()) check.fail(what + ": this rank holds no weights");
      for (const auto& [name, w] : resumed.final_weights) {
        auto it = reference.find(name);
        if (it == reference.end()) {
          if (exact) check.fail(what + ": parameter " + name + " is not in the reference");
          continue;
        }
        if (exact) {
          if (!torch::equal(w, it->second)) check.fail(what + ": " + name + " differs from the straight run's");
          continue;
        }
        diff_sq += (w - it->second).pow(2).sum().item<double>();
        ref_sq += it->second.pow(2).sum().item<double>();
        // As parallel_equivalence: each tensor within 1e-2 of how far training moved it in the
        // single-process run, which a wrong gradient (or a wrongly resharded tensor) exceeds.
        const double moved = (it->second - alone.initial_weights.at(name)).norm().item<double>();
        const double ratio = (w - it->second).norm().item<double>() / std::max(moved, 1e-30);
        if (!(ratio <= 1e-2))
          check.fail(strprintf("%s: %s differs from one process's by %.2e of its update", what.c_str(), name.c_str(), ratio));
      }
      const double weights_rel = std::sqrt(diff_sq / std::max(ref_sq, 1e-30));
      if (!exact && !(weights_rel <= 1e-5)) check.fail(strprintf("%s: weights differ by %.2e relative", what.c_str(), weights_rel));
      std::printf("[rank %d] %s: first loss after loading %.8f (straight %.8f), worst relative loss difference %.2e%s\n",
                  env.rank, what.c_str(), resumed.losses[0], straight.losses[10], worst,
                  exact ? ", bitwise" : strprintf(", weights %.2e vs one process", weights_rel).c_str());
    }
    std::printf("[rank %d] %s\n", env.rank, check.failures == 0 ? "resume OK" : "MISMATCH");
    return check.failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_resume: %s\n", e.what());
    return 2;
  }
}
