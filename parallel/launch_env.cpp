#include "parallel/launch_env.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace fp8tron {
namespace {
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}
int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  long value = std::strtol(v, &end, 10);
  if (*end != '\0' || value < 0) throw UserError(std::string("environment variable ") + name + "='" + v + "' is not a non-negative integer");
  return int(value);
}
}  // namespace

LaunchEnv read_launch_env() {
  LaunchEnv e;
  // torchrun first: it also works inside a SLURM allocation, where SLURM_* describe the srun step.
  if (env("WORLD_SIZE") && env("RANK")) {
    e.launcher = "torchrun";
    e.world_size = env_int("WORLD_SIZE", 1);
    e.rank = env_int("RANK", 0);
    e.local_rank = env_int("LOCAL_RANK", 0);
    e.local_world_size = env_int("LOCAL_WORLD_SIZE", 1);
    e.master_addr = env("MASTER_ADDR") ? env("MASTER_ADDR") : "127.0.0.1";
    e.master_port = env_int("MASTER_PORT", 29500);
    const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
    e.agent_store = agent && std::string(agent) == "True";
  } else if (env("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = "mpirun";
    e.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    e.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (env("SLURM_NTASKS") && env("SLURM_PROCID")) {
    e.launcher = "srun";
    e.world_size = env_int("SLURM_NTASKS", 1);
    e.rank = env_int("SLURM_PROCID", 0);
    e.local_rank = env_int("SLURM_LOCALID", 0);
    // SLURM_NTASKS_PER_NODE can read "8(x2)": its leading number is the count per node.
    const char* per_node = env("SLURM_NTASKS_PER_NODE");
    e.local_world_size = per_node ? std::max(1, std::atoi(per_node)) : 1;
    e.master_addr = env("MASTER_ADDR") ? env("MASTER_ADDR") : "";
    e.master_port = env_int("MASTER_PORT", 29500);
  } else if (env("WORLD_SIZE")) {
    // A dry run of a planned job: WORLD_SIZE alone says how big it will be.
    e.launcher = "WORLD_SIZE";
    e.world_size = env_int("WORLD_SIZE", 1);
  }
  if (e.world_size < 1) throw UserError("launcher environment: world size must be at least 1");
  if (e.rank >= e.world_size)
    throw UserError("launcher environment: rank " + std::to_string(e.rank) + " is not below world size " +
                    std::to_string(e.world_size));
  return e;
}

}  // namespace fp8tron
