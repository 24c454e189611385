// The tensor-parallel overlap plan from the flags: Megatron's --tp-comm-overlap family (Transformer
// Engine's per-GEMM defaults, overlaid with the --tp-comm-overlap-cfg file by TE's merge rule, then
// the direction switches), MindSpeed's --use-ascend-mc2 (TE's defaults, no switches, plus the
// output layer) and --use-ascend-coc (every collective pipelined in --coc-parallel-num pieces).
// Requirements that involve other settings (TP, SP, FP8 shapes, determinism) are validation rules
// (validation.cpp). Torch-free.
#pragma once
#include <string>
#include <vector>

#include "core/config/parallel_config.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

// `tp`: tensor-parallel size; `fp8`: FP8 linears (the wire of all-gathers becomes FP8, as TE's
// userbuffers for an FP8 run). One-line notices (ignored knobs, mappings) go to `notices`.
// UserError for a bad cfg file or contradictory flags.
TpOverlapConfig build_tp_overlap(const FlagValues& flags, int tp, bool fp8, std::vector<std::string>& notices);

// The sentence logged once for --use-ascend-mc2 / --use-ascend-coc: how MindSpeed's Ascend
// operators map onto fp8tron's NCCL schedules. Empty for --tp-comm-overlap.
std::string ascend_mapping_notice(const TpOverlapConfig& plan);

}  // namespace fp8tron
