#include "trainer/wandb_run.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "trainer/cli/arguments_json.h"

#ifndef FP8TRON_DEFAULT_WANDB_PYTHON
#define FP8TRON_DEFAULT_WANDB_PYTHON "python3"
#endif

namespace fp8tron {
namespace {

std::string executable_path() {
  std::vector<char> buffer(4096);
  const ssize_t n = readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  return n > 0 ? std::string(buffer.data(), size_t(n)) : std::string("fp8tron");
}

// The trainer's own arguments, for the run's "command" in W&B.
std::vector<std::string> command_line_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t start = 0; start < all.size();) {
    const size_t end = all.find('\0', start);
    args.push_back(all.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (!args.empty()) args.erase(args.begin());  // the program
  return args;
}

nlohmann::json optional_text(const std::string& text) { return text.empty() ? nlohmann::json(nullptr) : nlohmann::json(text); }

// Megatron's run config: vars(args), and the SLURM job's name that train() adds.
nlohmann::json run_config(const Config& c) {
  nlohmann::json config = arguments_json(c);
  const char* job = std::getenv("SLURM_JOB_NAME");
  config["slurm_job_name"] = job ? job : "N/A";
  return config;
}

WandbLoggerCommand wandb_logger_command() {
  const char* python = std::getenv("FP8TRON_WANDB_PYTHON");
  const std::string exe = executable_path();
  return {python && *python ? python : FP8TRON_DEFAULT_WANDB_PYTHON, exe.substr(0, exe.rfind('/') + 1) + "wandb_logger.py"};
}

}  // namespace

std::unique_ptr<WandbWriter> start_wandb_run(const Config& c) {
  const WandbConfig& w = c.logging.wandb;
  if (!w.enabled() || c.launch.rank != c.launch.world_size - 1) return nullptr;
  const nlohmann::json init = {{"project", w.project},
                               {"name", optional_text(w.exp_name)},
                               {"entity", optional_text(w.entity)},
                               {"dir", w.save_dir},
                               {"config", run_config(c)},
                               {"trainer_pid", int(getpid())},
                               {"program", executable_path()},
                               {"args", command_line_arguments()}};
  // Invalid UTF-8 in an argument becomes U+FFFD rather than an exception.
  const std::string text = init.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // wandb.init gives up after 90 s by default (WANDB_INIT_TIMEOUT): a margin above it.
  return std::make_unique<WandbWriter>(wandb_logger_command(), text, std::chrono::seconds(300));
}

}  // namespace fp8tron
