// What the launcher tells a process about the job, read from the environment only (no
// connection is made): mpirun (OMPI_COMM_WORLD_*), torchrun (RANK, WORLD_SIZE, LOCAL_RANK, ...),
// srun (SLURM_*), or a single process. --dry-run uses this to plan a job of any size on a laptop.
#pragma once
#include <string>

#include "core/config/parallel_config.h"

namespace fp8tron {

// Reads the process environment. Throws UserError when variables are inconsistent.
LaunchEnv read_launch_env();

}  // namespace fp8tron
