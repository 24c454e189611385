// --use-megatron-fsdp / --use-torch-fsdp2 with --data-parallel-sharding-strategy and the
// Megatron-FSDP precision flags -> DistributedConfig::dp_sharding, and the named rule that refuses
// what does not compose (yet), each by its flags (docs/sharded_data_parallel.md).
#pragma once
#include <string>

#include "core/config/config.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

// None without --use-megatron-fsdp or --use-torch-fsdp2 (FSDP2: optim_grads_params, its only mode).
DataParallelSharding build_data_parallel_sharding(const FlagValues& flags);
const char* data_parallel_sharding_name(DataParallelSharding s);

// "" when valid, else one line naming the flags.
std::string sharded_data_parallel_problem(const Config& c, const FlagValues& flags);

}  // namespace fp8tron
