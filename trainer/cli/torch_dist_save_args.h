// Which runs fp8tron can save in Megatron's torch_dist format (checkpoint/save_torch_dist.h): GPT
// models with Adam (the distributed optimizer too), without FP8, Megatron-FSDP, MTP or MLA, MoE
// with local layers only, synchronous persistent saves. Torch-free.
#pragma once
#include <string>

#include "core/config/config.h"

namespace fp8tron {

// The flag of the first feature of `c` that fp8tron cannot write in torch_dist yet; "" when none.
std::string torch_dist_unwritable_flag(const Config& c);

// A plain `--save --ckpt-format torch_dist` run with such a feature saves fp8tron's own format
// instead, with a notice naming the flag (Megatron's configurations pass --ckpt-format torch_dist
// as a matter of course); an explicit conversion (--ckpt-convert-format torch_dist) is left for
// the validation rule to refuse.
void settle_torch_dist_save(Config& c);

}  // namespace fp8tron
