// The CUDA-graph flags -> CudaGraphConfig. --cuda-graph-impl full_iteration (Megatron's
// full-iteration graph; older Megatron spelled it --enable-cuda-graph, or --cuda-graph-impl local,
// with --cuda-graph-scope full_iteration) captures each step's forward and backward passes
// (trainer/step_graph.h). Megatron's per-layer graphs (local / transformer_engine over attn, mlp,
// moe, ...) are not implemented: asked for, every step runs eagerly and one warning line says so.
#pragma once
#include <string>
#include <vector>

#include "core/config/config.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

// Per-layer graph requests become lines in `warnings`.
CudaGraphConfig build_cuda_graph_config(const FlagValues& flags, std::vector<std::string>& warnings);

// "" when the full-iteration graph can capture this configuration's step, else one line naming
// what stands in the way and how to run.
std::string cuda_graph_problem(const Config& c, const FlagValues& flags);

}  // namespace fp8tron
