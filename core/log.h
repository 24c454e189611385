// Logging facade over spdlog. Only rank 0 prints info lines by default (Megatron's print_rank_0);
// warnings and errors print on every rank that has them. Torch translation units use this instead
// of spdlog directly (see core/text.h for why).
#pragma once
#include <string>

namespace fp8tron::log {

// Called once at start-up: `rank` decides whether info lines print; `all_ranks` prints from all.
void init(int rank, bool all_ranks);
int rank();

void info(const std::string& message);      // rank 0 only (unless all_ranks)
void warning(const std::string& message);   // every rank
void error(const std::string& message);     // every rank
// Prints a warning once per process for a given key (e.g. an emulated feature's notice).
void warning_once(const std::string& key, const std::string& message);

}  // namespace fp8tron::log
