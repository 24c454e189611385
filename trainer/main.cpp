// fp8tron: Megatron-LM's flags in, a trained GPT out.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

#include <c10/util/Logging.h>

#include "core/error.h"
#include "core/log.h"
#include "core/version.h"
#include "data/fim_tokens.h"
#include "data/tokenizer.h"
#include "parallel/launch_env.h"
#include "trainer/cli/checkpoint_args.h"
#include "trainer/cli/config_builder.h"
#include "trainer/cli/dry_run.h"
#include "trainer/cli/flags.h"
#include "trainer/cli/logging_args.h"
#include "trainer/fatal_error.h"
#include "trainer/trainer.h"

int main(int argc, char** argv) {
  using namespace fp8tron;
  // LibTorch's own warnings (c10d's store client when a peer rank has ended, with a stack trace)
  // are not fp8tron's lines: errors only, unless TORCH_CPP_LOG_LEVEL asks for more.
  setenv("TORCH_CPP_LOG_LEVEL", "ERROR", /*overwrite=*/0);
  c10::initLogging();
  int rank = -1;  // known once the launch environment is read: an error then names its rank
  bool configuring = true;  // until the configuration is built and checked
  try {
    ParsedCommandLine parsed = parse_command_line(argc, argv);
    if (parsed.help_requested) {
      std::fputs(usage_text().c_str(), stdout);
      return 0;
    }
    if (parsed.version_requested) {
      std::printf("%s\n", fp8tron_version_line().c_str());
      return 0;
    }
    const LaunchEnv launch = read_launch_env();
    if (launch.world_size > 1) rank = launch.rank;
    const bool dry_run = parsed.values.get_bool("dry-run");
    // A dry run never touches a GPU: it plans for cuda unless told otherwise.
    const bool gpu = dry_run ? parsed.values.get_string("device") != "cpu" : cuda_available();
    log::init(launch.rank, parsed.values.get_bool("log-all-ranks"));
    // Before the first line: --logging-level, else MEGATRON_LOGGING_LEVEL (Megatron sets it first too).
    if (const auto level = resolve_logging_level(parsed.values, [](const char* name) { return std::getenv(name); }))
      log::set_level(*level);
    log::info(fp8tron_version_line());
    apply_checkpoint_args(parsed.values);  // --use-checkpoint-args
    // Real datasets: the tokenizer says the vocabulary size (padded later) and the eod id.
    auto tokenizer_info = [](const DataConfig& d) {
      auto tokenizer = data::build_tokenizer(data::tokenizer_options(d));
      TokenizerInfo info{tokenizer->vocab_size(), tokenizer->eod(), tokenizer->pad(), {}};
      if (d.fim.enabled) data::fim_options(d.fim, *tokenizer, &info.warnings);  // its tokens, before any allocation
      return info;
    };
    const Config config = build_config(parsed.values, launch, gpu, tokenizer_info);
    for (const auto& w : config.hint_warnings) log::warning(w);
    for (const auto& n : config.notices) log::info(n);
    log::print(format_arguments(config));  // Megatron's _print_args prints, whatever the logging level
    // The plan is what a dry run was asked for; in training it is one of fp8tron's notes.
    if (config.dry_run) log::print(format_plan(config));
    else log::info(format_plan(config));
    if (config.dry_run) {
      require_supported(config);  // the real run would be refused: so is the plan
      log::print("dry run: configuration is valid; exiting without reading data or touching a GPU");
      return 0;
    }
    configuring = false;
    train(config);
    return 0;
  } catch (const RunEnd& e) {
    // The rerun engine ends the job with Megatron's exit codes (16: restart elsewhere, 17: stop).
    std::fprintf(stderr, "fp8tron: %s\n", e.what());
    return e.status();
  } catch (const std::exception& e) {
    const FatalReport report = report_fatal_error(e, rank);
    if (configuring && rank > 0 && dynamic_cast<const UserError*>(&e)) {
      // Every rank reads the same flags and refuses them alike: rank 0 says so once, and its exit
      // makes the launcher end the others (mpirun, torchrun) before they print the same line. A
      // rank still running after the grace has an error of its own (a file missing on its node).
      std::this_thread::sleep_for(std::chrono::seconds(10));
    }
    std::fprintf(stderr, "%s\n", report.line.c_str());
    if (rank >= 0 && !configuring) {
      // One rank of a job failed while the others may wait in a collective for it. Ending without
      // MPI_Finalize tells mpirun to end them now (it waits for a rank that finalized and then
      // failed); torchrun and srun --kill-on-bad-exit end them on any failure. Otherwise they
      // would hold their GPUs until --distributed-timeout-minutes.
      std::fflush(nullptr);
      std::_Exit(report.exit_code);
    }
    return report.exit_code;
  }
}
