// Logging facade over spdlog, with Megatron's two kinds of output:
//  - print(): what Megatron prints with print_rank_0 / print_rank_last (the argument dump, the
//    iteration and validation lines, timers, checkpoint and exit messages). Never filtered.
//  - info() / warning() / error(): what Megatron sends through Python's logging (its own notes,
//    fp8tron's diagnostics), filtered by --logging-level / MEGATRON_LOGGING_LEVEL as Python's
//    logging is: a record of level L is emitted when L >= the level (10 DEBUG, 20 INFO,
//    30 WARNING, 40 ERROR, 50 CRITICAL). fp8tron's default is 20 (info lines shown).
// print() and info() print on rank 0 only (unless all_ranks); warnings and errors on every rank
// that has them. Torch translation units use this instead of spdlog directly (see core/text.h).
#pragma once
#include <string>

namespace fp8tron::log {

// Python's logging levels.
constexpr int kDebug = 10, kInfo = 20, kWarning = 30, kError = 40, kCritical = 50;

// Called once at start-up: `rank` decides whether info lines print; `all_ranks` prints from all.
void init(int rank, bool all_ranks);
int rank();
// The threshold: records below it are dropped (Python's Logger.setLevel on the root logger).
void set_level(int level);
int level();
bool enabled(int record_level);  // record_level >= level()

void print(const std::string& message);     // rank 0 only (unless all_ranks); never filtered
void info(const std::string& message);      // rank 0 only (unless all_ranks); level 20
void warning(const std::string& message);   // every rank; level 30
void error(const std::string& message);     // every rank; level 40
// Prints a warning once per process for a given key (e.g. an emulated feature's notice).
void warning_once(const std::string& key, const std::string& message);

}  // namespace fp8tron::log
