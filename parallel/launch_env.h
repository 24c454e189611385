// What the launcher tells a process about the job, read from the environment only (no
// connection is made): mpirun (OMPI_COMM_WORLD_*), torchrun (RANK, WORLD_SIZE, LOCAL_RANK, ...),
// srun (SLURM_*), or a single process. --dry-run uses this to plan a job of any size on a laptop.
#pragma once
#include <string>

namespace fp8tron {

struct LaunchEnv {
  std::string launcher = "single process";  // "mpirun", "torchrun", "srun", "single process"
  int world_size = 1;
  int rank = 0;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  // torchrun / srun rendezvous
  int master_port = 0;
  bool agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the store
};

// Reads the process environment. Throws UserError when variables are inconsistent.
LaunchEnv read_launch_env();

}  // namespace fp8tron
