#include "models/linear/linear_plan.h"

#include "core/text.h"

namespace fp8tron {
namespace {

const char* path_text(LinearPath p) {
  switch (p) {
    case LinearPath::kPlain: return "bf16/fp32 GEMMs";
    case LinearPath::kFp8: return "FP8 GEMMs";
    case LinearPath::kOverlapped: return "bf16/fp32 GEMMs";
    case LinearPath::kOverlappedFp8: return "FP8 GEMMs";
  }
  return "?";
}

std::string overlap_text(const overlap::TpLinearPlan& o) {
  std::vector<std::string> parts;
  auto add = [&](const char* gemm, const GemmOverlap& g) {
    if (g.enabled()) parts.push_back(strprintf("%s %s%s", gemm, overlap_method_name(g.method), g.fp8_wire ? " (FP8 on the wire)" : ""));
  };
  add("fprop", o.fprop);
  add("dgrad", o.dgrad);
  add("wgrad", o.wgrad);
  return parts.empty() ? "nothing" : join(parts, ", ");
}

std::string comm_text(const LinearPlan& p) {
  if (p.tp_size == 1) return "one tensor-parallel rank: no communication";
  const bool column = p.role != LinearRole::kRow;
  std::string text = strprintf("TP %d%s: ", p.tp_size, p.sequence_parallel ? " with SP" : "");
  if (column) text += p.sequence_parallel ? "all-gather of the sequence shards before" : "input copied (all-reduce in backward)";
  else text += p.sequence_parallel ? "reduce-scatter to sequence shards after" : "all-reduce after";
  if (p.overlapped()) text += ", overlapped with the GEMMs (" + overlap_text(p.overlap) + ")";
  return text;
}

const char* norm_text(NormPlacement n) {
  switch (n) {
    case NormPlacement::kNone: return "";
    case NormPlacement::kResidualNormKernel: return "norm: the fused residual add + norm kernel, then the GEMM";
    case NormPlacement::kNormLinearOp: return "norm: in one op with the GEMM (its output rebuilt in backward)";
    case NormPlacement::kFp8Cast: return "norm: fused into the FP8 cast of this rank's shard";
  }
  return "";
}

const char* bias_text(BiasPlacement b) {
  switch (b) {
    case BiasPlacement::kNone: return "no bias";
    case BiasPlacement::kGemmEpilogue: return "bias: in the GEMM";
    case BiasPlacement::kAfterReduction: return "bias: added after the reduction";
    case BiasPlacement::kNextNorm: return "bias: left to the next residual add + norm on GPUs (in the GEMM under hidden dropout)";
  }
  return "";
}

}  // namespace

std::string LinearPlan::describe() const {
  std::vector<std::string> parts = {path_text(path), comm_text(*this)};
  if (norm != NormPlacement::kNone) parts.push_back(norm_text(norm));
  parts.push_back(bias_text(bias));
  if (path == LinearPath::kPlain || path == LinearPath::kOverlapped)
    parts.push_back(main_grad_fusion ? "weight gradient: into its fp32 main gradient" : "weight gradient: to autograd");
  else
    parts.push_back(main_grad_fusion ? "weight gradient: FP8 wgrad GEMM into its fp32 main gradient"
                                     : "weight gradient: FP8 wgrad GEMM, to autograd");
  return join(parts, " | ");
}

LinearPlan resolve_linear_plan(const LinearSpec& spec, const TensorParallelContext& tp, bool gradient_accumulation_fusion) {
  LinearPlan p;
  p.role = spec.role;
  p.tp_size = tp.size;
  p.sequence_parallel = tp.sequence_parallel && tp.size > 1;
  p.main_grad_fusion = gradient_accumulation_fusion;
  // The communicating op runs only under sequence parallelism over several ranks (the validation
  // rules require it of the flags).
  const bool overlapped = tp.size > 1 && tp.sequence_parallel && tp.overlap &&
                          overlap::plan_for_module(*tp.overlap, spec.name, &p.overlap);
  p.path = overlapped ? (spec.fp8 ? LinearPath::kOverlappedFp8 : LinearPath::kOverlapped)
                      : (spec.fp8 ? LinearPath::kFp8 : LinearPath::kPlain);
  if (spec.role == LinearRole::kNormColumn) {
    // FP8 without the overlap runs the residual-norm kernel and then the GEMM's input cast, not the
    // norm fused into the cast (fp8::fp8_norm_linear): that kernel also takes the residual add each
    // way, which measured 0.5-1.1% faster on an H200 (docs/performance.md).
    if (p.path == LinearPath::kOverlappedFp8) p.norm = NormPlacement::kFp8Cast;
    else if (p.path == LinearPath::kPlain && tp.size == 1) p.norm = NormPlacement::kNormLinearOp;
    else p.norm = NormPlacement::kResidualNormKernel;
  }
  if (!spec.bias) {
    p.bias = BiasPlacement::kNone;
  } else if (spec.role != LinearRole::kRow) {
    p.bias = BiasPlacement::kGemmEpilogue;
  } else if (overlapped || tp.size > 1) {
    // Added to each rank's output after the sum (under SP to its own sequence shard).
    p.bias = BiasPlacement::kAfterReduction;
  } else {
    // One rank holds the whole sum. A bf16 output projection may leave it to the next norm, whose
    // backward pass sums its gradient (no bias-gradient epilogue on the wgrad GEMM); under tensor
    // parallelism it stays after the reduction, as the deferral has not run on several GPUs.
    p.bias = spec.defer_bias && p.path == LinearPath::kPlain ? BiasPlacement::kNextNorm : BiasPlacement::kGemmEpilogue;
  }
  return p;
}

}  // namespace fp8tron
