// The one validated, immutable configuration of a run, built once from flags + JSON by the CLI
// (trainer/cli/config_builder.h). One struct per domain, each in its own header here so that
// models/, parallel/, fp8/ and data/ take only the struct they need without knowing about flags.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/config/checkpoint_config.h"
#include "core/config/context_parallel_config.h"
#include "core/config/data_config.h"
#include "core/config/logging_config.h"
#include "core/config/model_config.h"
#include "core/config/parallel_config.h"
#include "core/config/precision_config.h"
#include "core/config/training_config.h"

namespace fp8tron {

struct Config {
  ModelConfig model;
  OptimizerConfig optimizer;
  LrScheduleConfig lr_schedule;
  PrecisionConfig precision;
  TrainingConfig training;
  LoggingConfig logging;
  ProfilingConfig profiling;
  DataConfig data;
  ParallelSizes parallel;
  DistributedConfig distributed;
  ContextParallelConfig context_parallel;  // --cp-comm-type, --hierarchical-context-parallel-sizes
  CheckpointConfig checkpoint;
  LaunchEnv launch;
  std::string device;      // "cpu" | "cuda"
  bool dry_run = false;
  bool print_model_plan = false;  // build the run, print how each module runs, exit before step 1
  // Flags that are recognised but whose feature has not landed, as "--flag (feature)"; training
  // refuses to start while any is set. --dry-run lists them.
  std::vector<std::string> not_supported_yet;
  // Hint-only flags that were given, as one-line warnings.
  std::vector<std::string> hint_warnings;
  // What Megatron would log about the flags at start-up (defaults it applies, values it
  // overrides), printed as info lines.
  std::vector<std::string> notices;
  // The resolved flags (name -> value text), printed by --dry-run and at start-up.
  std::vector<std::pair<std::string, std::string>> resolved_flags;
};

}  // namespace fp8tron
