// The attention output gate (--attention-output-gate, Qwen3-Next's gated attention): each query
// head's attention output is scaled element-wise by sigmoid of a gate that the QKV projection
// computes beside the query, before the output projection. As Megatron: in fp32, then back to the
// output's dtype.
#pragma once
#include <torch/torch.h>

namespace fp8tron {

// out: [s, b, heads x d]; gate: [s, b, groups, heads per group, d] (a view of the QKV output).
torch::Tensor apply_output_gate(const torch::Tensor& out, const torch::Tensor& gate);

}  // namespace fp8tron
