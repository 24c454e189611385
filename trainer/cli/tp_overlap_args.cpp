#include "trainer/cli/tp_overlap_args.h"

#include <set>

#include "core/error.h"
#include "core/text.h"
#include "trainer/cli/tp_overlap_cfg.h"

namespace fp8tron {
namespace {

using M = OverlapMethod;
using G = TpGemm;

// The GEMMs whose collective is an all-gather: TE gives their userbuffers an FP8 buffer in an FP8
// run (the input, or dY of proj/fc2, is quantised before it is gathered).
bool all_gather_gemm(G g) {
  switch (g) {
    case G::kQkvFprop: case G::kQkvDgrad: case G::kProjDgrad: case G::kProjWgrad:
    case G::kFc1Fprop: case G::kFc1Dgrad: case G::kFc2Dgrad: case G::kFc2Wgrad: return true;
    default: return false;
  }
}

// Transformer Engine's initialize_ub defaults for every GEMM.
std::array<GemmOverlap, kNumTpGemms> te_defaults(int tp) {
  std::array<GemmOverlap, kNumTpGemms> d{};
  auto ring = [&](G g) { d[size_t(g)] = GemmOverlap{M::kRingExchange, tp, false, false, 1, false, 1, true}; };
  auto pipeline = [&](G g) { d[size_t(g)] = GemmOverlap{M::kPipeline, 4, false, false, 16, true, 2, false}; };
  auto bulk = [&](G g) { d[size_t(g)] = GemmOverlap{M::kBulk, 4, false, false, 16, true, 2, false}; };
  for (G g : {G::kQkvFprop, G::kFc1Fprop, G::kProjDgrad, G::kFc2Dgrad}) ring(g);
  for (G g : {G::kProjFprop, G::kFc2Fprop}) pipeline(g);
  for (G g : {G::kQkvDgrad, G::kFc1Dgrad, G::kQkvWgrad, G::kFc1Wgrad}) bulk(g);
  for (G g : {G::kProjWgrad, G::kFc2Wgrad}) d[size_t(g)].method = M::kExternal;
  return d;
}

bool find_gemm(const std::string& name, G* out) {
  for (size_t i = 0; i < kNumTpGemms; ++i)
    if (name == tp_gemm_name(G(i))) { *out = G(i); return true; }
  return false;
}

// The methods TE accepts for each GEMM (its checks, and which overlap classes exist).
bool method_allowed(G g, M m) {
  switch (g) {
    case G::kQkvFprop: case G::kFc1Fprop: case G::kProjDgrad: case G::kFc2Dgrad: return m == M::kRingExchange;
    case G::kProjFprop: case G::kFc2Fprop: return m == M::kPipeline || m == M::kRingExchange;
    case G::kQkvDgrad: case G::kFc1Dgrad: return m == M::kBulk || m == M::kPipeline || m == M::kRingExchange;
    case G::kQkvWgrad: case G::kFc1Wgrad: return m == M::kBulk;
    case G::kProjWgrad: case G::kFc2Wgrad: return m == M::kExternal;
  }
  return false;
}

struct CfgReader {
  const UbCfgFile& file;
  const UbCfgEntry& entry;
  const UbCfgField& field;
  [[noreturn]] void refuse(const std::string& why) const {
    throw UserError("--tp-comm-overlap-cfg " + file.where(field.line) + ": " + entry.gemm + "." + field.key + ": " + why);
  }
  bool boolean() const {
    bool b = false;
    long long i = 0;
    if (parse_yaml_bool(field.value, &b)) return b;
    if (parse_yaml_int(field.value, &i)) return i != 0;  // TE reads 0/1 as false/true
    refuse("expected a boolean (true/false or 1/0), got '" + field.value + "'");
  }
  int integer(long long lo, long long hi) const {
    long long i = 0;
    if (!parse_yaml_int(field.value, &i)) refuse("expected an integer, got '" + field.value + "'");
    if (i < lo || i > hi) refuse(strprintf("must be in [%lld, %lld], got %lld", lo, hi, i));
    return int(i);
  }
  M method() const {
    for (M m : {M::kRingExchange, M::kPipeline, M::kBulk, M::kExternal})
      if (field.value == overlap_method_name(m)) return m;
    refuse("unknown method '" + field.value + "' (ring_exchange, pipeline, bulk or external)");
  }
};

// What the file sets, per GEMM, on top of the defaults (TE: dict.update of the default entry).
struct CfgOverlay {
  bool has_method = false, has_splits = false, fp8_buf = false, use_ce_given = false, comm_sms_given = false;
};

void apply_field(const CfgReader& r, G g, GemmOverlap& o, CfgOverlay& seen, bool fp8, std::vector<std::string>& notices) {
  const std::string& k = r.field.key;
  if (k == "method") {
    o.method = r.method();
    seen.has_method = true;
  } else if (k == "num_splits") {
    o.num_splits = r.integer(1, 1 << 16);
    seen.has_splits = true;
  } else if (k == "aggregate") {
    o.aggregate = r.boolean();
  } else if (k == "fp8_buf") {
    seen.fp8_buf = r.boolean();
  } else if (k == "num_sm") {
    o.num_sm = r.integer(1, 1024);
    seen.comm_sms_given = true;
  } else if (k == "set_sm_margin") {
    o.sm_margin = r.boolean();
  } else if (k == "cga_size") {
    o.cga_size = r.integer(1, 8);
    seen.comm_sms_given = true;
  } else if (k == "use_ce") {
    o.use_ce = r.boolean();
    seen.use_ce_given = o.use_ce;
  } else if (k == "atomic_gemm") {
    o.atomic_gemm = r.boolean();
    if (o.atomic_gemm && !fp8) r.refuse("atomic GEMMs exist only for FP8 GEMMs (Transformer Engine refuses them without --fp8-format)");
    if (o.atomic_gemm)
      notices.push_back(std::string(tp_gemm_name(g)) + ".atomic_gemm: cuBLAS atomic-counter GEMMs compute the same product; "
                        "fp8tron runs its ordinary chunked GEMMs (ignored)");
  } else if (k == "comm_priority" || k == "gemm_priority") {
    (k == "comm_priority" ? o.comm_priority : o.gemm_priority) = r.integer(-1000, 1000);
    notices.push_back(std::string(tp_gemm_name(g)) + "." + k + ": fp8tron's communication streams always have the "
                      "highest priority and GEMMs run on the compute stream (ignored)");
  } else if (k == "pipeline_rs_overlap_first_gemm") {
    r.boolean();  // fp8tron always issues GEMM j+1 before the reduce-scatter of split j
  } else if (k == "is_reduce_scatter") {
    r.refuse("the direction of a GEMM's collective follows from its name; only qkv_dgrad/fc1_dgrad may turn into a "
             "reduce-scatter, by a non-bulk method with --tp-comm-overlap-rs-dgrad");
  } else {
    r.refuse("unknown field (Transformer Engine's add_ub takes method, num_splits, aggregate, fp8_buf, num_sm, "
             "set_sm_margin, cga_size, use_ce, atomic_gemm, comm_priority, gemm_priority, pipeline_rs_overlap_first_gemm)");
  }
}

// TE's merge: defaults, then each entry of the file; unknown GEMM names are ignored (with a notice).
std::array<CfgOverlay, kNumTpGemms> overlay_cfg(const std::string& path, std::array<GemmOverlap, kNumTpGemms>& plan,
                                                 bool fp8, std::vector<std::string>& notices) {
  std::array<CfgOverlay, kNumTpGemms> seen{};
  if (path.empty()) return seen;
  const UbCfgFile file = read_ub_cfg(path);
  for (const auto& entry : file.entries) {
    G g;
    if (!find_gemm(entry.gemm, &g)) {
      notices.push_back("--tp-comm-overlap-cfg " + file.where(entry.line) + ": '" + entry.gemm +
                        "' is not one of fp8tron's (and Transformer Engine's) GEMM names; ignored, as TE ignores it");
      continue;
    }
    for (const auto& field : entry.fields) apply_field(CfgReader{file, entry, field}, g, plan[size_t(g)], seen[size_t(g)], fp8, notices);
    if (!method_allowed(g, plan[size_t(g)].method))
      throw UserError("--tp-comm-overlap-cfg " + file.where(entry.line) + ": " + entry.gemm + " cannot use method " +
                      overlap_method_name(plan[size_t(g)].method));
  }
  // TE: a wgrad entry next to a non-bulk dgrad, and `external` without a ring dgrad, are errors.
  for (auto [dgrad, wgrad] : {std::pair{G::kQkvDgrad, G::kQkvWgrad}, std::pair{G::kFc1Dgrad, G::kFc1Wgrad}})
    if (plan[size_t(dgrad)].method != M::kBulk)
      for (const auto& entry : file.entries)
        if (entry.gemm == tp_gemm_name(wgrad))
          throw UserError("--tp-comm-overlap-cfg " + file.where(entry.line) + ": cannot configure " + entry.gemm +
                          " when " + tp_gemm_name(dgrad) + " uses a non-bulk method (it becomes a reduce-scatter)");
  for (auto [dgrad, wgrad] : {std::pair{G::kProjDgrad, G::kProjWgrad}, std::pair{G::kFc2Dgrad, G::kFc2Wgrad}})
    if (plan[size_t(wgrad)].method == M::kExternal && plan[size_t(dgrad)].method != M::kRingExchange)
      throw UserError(std::string("--tp-comm-overlap-cfg ") + path + ": " + tp_gemm_name(wgrad) +
                      " external needs " + tp_gemm_name(dgrad) + " ring_exchange");
  return seen;
}

// TE's fp8_buf rule: all-gathers move FP8 in an FP8 run; a pipeline reduce-scatter only if asked.
void set_wires(std::array<GemmOverlap, kNumTpGemms>& plan, const std::array<CfgOverlay, kNumTpGemms>& seen, bool fp8) {
  for (size_t i = 0; i < kNumTpGemms; ++i)
    plan[i].fp8_wire = fp8 && (all_gather_gemm(G(i)) || (seen[i].fp8_buf && plan[i].method == M::kPipeline));
}

bool given_either(const FlagValues& f, const std::string& suffix) {
  return f.get_bool("no-" + suffix) || f.get_bool("disable-" + suffix);
}

// Megatron's switches over the merged plan (TE modules' ub_* arguments).
void apply_switches(const FlagValues& f, std::array<GemmOverlap, kNumTpGemms>& plan,
                    const std::array<CfgOverlay, kNumTpGemms>& seen) {
  auto off = [&](G g) { plan[size_t(g)].method = M::kOff; };
  const bool ag = !given_either(f, "tp-comm-overlap-ag"), rs = !given_either(f, "tp-comm-overlap-rs");
  const bool bulk_dgrad = !given_either(f, "tp-comm-bulk-dgrad"), bulk_wgrad = !given_either(f, "tp-comm-bulk-wgrad");
  const bool rs_dgrad = f.get_bool("tp-comm-overlap-rs-dgrad");
  struct Column { G fprop, dgrad, wgrad; bool disabled; };
  for (const Column& c : {Column{G::kQkvFprop, G::kQkvDgrad, G::kQkvWgrad, f.get_bool("tp-comm-overlap-disable-qkv")},
                          Column{G::kFc1Fprop, G::kFc1Dgrad, G::kFc1Wgrad, f.get_bool("tp-comm-overlap-disable-fc1")}}) {
    if (!ag || c.disabled) off(c.fprop);
    GemmOverlap& d = plan[size_t(c.dgrad)];
    if (d.method != M::kBulk && !rs_dgrad)
      throw UserError(std::string("--tp-comm-overlap-cfg gives ") + tp_gemm_name(c.dgrad) + " method " +
                      overlap_method_name(d.method) + ", a reduce-scatter overlap, which needs --tp-comm-overlap-rs-dgrad");
    if (rs_dgrad && !c.disabled) {
      // TE: an rs-dgrad module without its own cfg entry reduce-scatters through a 4-split pipeline.
      if (!seen[size_t(c.dgrad)].has_method) { d.method = M::kPipeline; d.num_splits = 4; }
      d.fp8_wire = false;
      off(c.wgrad);  // both bulk overlaps give way to the reduce-scatter of dgrad
      continue;
    }
    // TE's tp_comm_overlap_disable_qkv/fc1 also drop this module's rs-dgrad: back to the bulk overlaps.
    d.method = M::kBulk;
    if (!bulk_dgrad) off(c.dgrad);
    if (!bulk_wgrad) off(c.wgrad);
  }
  for (G g : {G::kProjDgrad, G::kFc2Dgrad})
    if (!ag) off(g);
  for (G g : {G::kProjFprop, G::kFc2Fprop})
    if (!rs) off(g);
  // The row-parallel wgrad operand comes with the dgrad ring; nothing to do without it.
  if (plan[size_t(G::kProjDgrad)].method != M::kRingExchange) off(G::kProjWgrad);
  if (plan[size_t(G::kFc2Dgrad)].method != M::kRingExchange) off(G::kFc2Wgrad);
}

// Knobs that do not change fp8tron's schedule, said once each.
void note_ignored_knobs(std::array<GemmOverlap, kNumTpGemms>& plan, const std::array<CfgOverlay, kNumTpGemms>& seen,
                     int tp, std::vector<std::string>& notices) {
  bool ce_noted = false, sms_noted = false;
  for (size_t i = 0; i < kNumTpGemms; ++i) {
    if (seen[i].comm_sms_given && !sms_noted) {
      notices.push_back("--tp-comm-overlap-cfg num_sm/cga_size size Transformer Engine's communication kernels; fp8tron's "
                        "are NCCL's on the tensor-parallel group, which choose their own CTAs: num_sm only sets the SM "
                        "budget of the overlapped FP8 GEMMs (with set_sm_margin)");
      sms_noted = true;
    }
    GemmOverlap& g = plan[i];
    if (g.method == M::kRingExchange && seen[i].has_splits && g.num_splits != tp)
      notices.push_back(strprintf("--tp-comm-overlap-cfg: %s num_splits %d ignored: ring exchange always uses one chunk "
                                  "per tensor-parallel rank (%d)", tp_gemm_name(G(i)), g.num_splits, tp));
    if (g.method == M::kRingExchange) g.num_splits = tp;
    if (g.aggregate && (tp < 4 || tp % 2 != 0)) {
      notices.push_back(strprintf("--tp-comm-overlap-cfg: %s aggregate ignored: pairing neighbours needs an even "
                                  "tensor-parallel size of at least 4 (it is %d)", tp_gemm_name(G(i)), tp));
      g.aggregate = false;
    }
    if (g.aggregate && g.method != M::kRingExchange) g.aggregate = false;  // TE reads it for ring all-gathers only
    if (seen[i].use_ce_given && !ce_noted) {
      notices.push_back("--tp-comm-overlap-cfg use_ce: fp8tron has no copy-engine transport yet; ring exchanges run as "
                        "NCCL point-to-point transfers");
      ce_noted = true;
    }
  }
}

TpOverlapConfig megatron_plan(const FlagValues& f, int tp, bool fp8, std::vector<std::string>& notices) {
  TpOverlapConfig c;
  c.source = TpOverlapSource::kMegatron;
  c.gemms = te_defaults(tp);
  const auto seen = overlay_cfg(f.get_string("tp-comm-overlap-cfg"), c.gemms, fp8, notices);
  set_wires(c.gemms, seen, fp8);
  apply_switches(f, c.gemms, seen);
  note_ignored_knobs(c.gemms, seen, tp, notices);
  return c;
}

// MindSpeed's MC2: fused all-gather+matmul and matmul+reduce-scatter in every tensor-parallel
// linear, backward re-gathering the input under dgrad and reduce-scattering dgrad under wgrad: TE's
// default plan; MindSpeed patches the output layer's ColumnParallelLinear as well.
TpOverlapConfig mc2_plan(int tp, bool fp8) {
  TpOverlapConfig c;
  c.source = TpOverlapSource::kMc2;
  c.gemms = te_defaults(tp);
  set_wires(c.gemms, {}, fp8);
  c.output_layer = true;
  return c;
}

// MindSpeed's CoC: every collective pipelined in `pieces` pieces (mode 2), or the same linears
// without splitting (mode 1: one piece, plain collectives).
TpOverlapConfig coc_plan(int pieces, int mode, bool fp8) {
  TpOverlapConfig c;
  c.source = TpOverlapSource::kCoc;
  if (mode == 1) return c;  // every method Off: fp8tron's op with the plain collectives
  const GemmOverlap piecewise{M::kPipeline, pieces};
  for (G g : {G::kQkvFprop, G::kFc1Fprop, G::kProjDgrad, G::kFc2Dgrad, G::kProjFprop, G::kFc2Fprop})
    c.gemm(g) = piecewise;
  for (G g : {G::kQkvDgrad, G::kFc1Dgrad, G::kQkvWgrad, G::kFc1Wgrad}) c.gemm(g) = GemmOverlap{M::kBulk, 4};
  set_wires(c.gemms, {}, fp8);
  return c;
}

const std::vector<std::string>& megatron_switches() {
  static const std::vector<std::string> names = {
      "no-tp-comm-overlap-ag", "disable-tp-comm-overlap-ag", "no-tp-comm-overlap-rs", "disable-tp-comm-overlap-rs",
      "no-tp-comm-bulk-dgrad", "disable-tp-comm-bulk-dgrad", "no-tp-comm-bulk-wgrad", "disable-tp-comm-bulk-wgrad",
      "tp-comm-overlap-rs-dgrad", "tp-comm-overlap-disable-qkv", "tp-comm-overlap-disable-fc1", "tp-comm-overlap-cfg"};
  return names;
}

}  // namespace

TpOverlapConfig build_tp_overlap(const FlagValues& f, int tp, bool fp8, std::vector<std::string>& notices) {
  const bool megatron = f.get_bool("tp-comm-overlap"), mc2 = f.get_bool("use-ascend-mc2"), coc = f.get_bool("use-ascend-coc");
  if (mc2 && coc) throw UserError("--use-ascend-mc2 and --use-ascend-coc: mc2 and coc can not be used together (MindSpeed); choose one");
  if (megatron && (mc2 || coc))
    throw UserError(std::string("--tp-comm-overlap and ") + (mc2 ? "--use-ascend-mc2" : "--use-ascend-coc") +
                    " both select the tensor-parallel overlap (Megatron's and MindSpeed's names for it); give one");
  const int pieces = int(f.get_int("coc-parallel-num"));
  int mode = int(f.get_int("coc-mode"));
  if (coc && pieces != 1 && pieces != 2 && pieces != 4 && pieces != 8)
    throw UserError(strprintf("--coc-parallel-num must be 1, 2, 4 or 8 (MindSpeed), got %d", pieces));
  if (coc && (mode < -1 || mode > 2)) throw UserError(strprintf("--coc-mode must be -1, 0, 1 or 2 (MindSpeed), got %d", mode));
  if (!megatron)
    for (const auto& name : megatron_switches())
      if (f.given(name)) notices.push_back("--" + name + " has no effect without --tp-comm-overlap");
  if (!coc)
    for (const char* name : {"coc-parallel-num", "coc-mode", "coc-fused-kernel"})
      if (f.given(name)) notices.push_back(std::string("--") + name + " has no effect without --use-ascend-coc");
  if (megatron) return megatron_plan(f, tp, fp8, notices);
  if (mc2) return mc2_plan(tp, fp8);
  if (!coc) return {};
  if (f.get_bool("coc-fused-kernel")) {
    // MindSpeed: the fused ATB kernels take priority over --coc-parallel-num.
    TpOverlapConfig c = mc2_plan(tp, fp8);
    c.source = TpOverlapSource::kCoc;
    c.output_layer = false;
    notices.push_back("--coc-fused-kernel: Ascend's fused all-gather+matmul / matmul+reduce-scatter kernels map onto "
                      "fp8tron's ring-exchange schedule (the --use-ascend-mc2 one); --coc-parallel-num is not used");
    return c;
  }
  if (mode == -1) mode = pieces == 1 ? 0 : 2;
  if (mode == 0) {
    notices.push_back("--use-ascend-coc with --coc-mode 0 (or --coc-parallel-num 1): the original linears, no overlap");
    return {};
  }
  return coc_plan(pieces, mode, fp8);
}

std::string ascend_mapping_notice(const TpOverlapConfig& plan) {
  if (plan.source == TpOverlapSource::kMc2)
    return "--use-ascend-mc2: Ascend's fused all-gather+matmul / matmul+reduce-scatter (HCCL MC2) runs on NVIDIA GPUs as "
           "fp8tron's ring-exchange all-gather+GEMM and pipelined GEMM+reduce-scatter over NCCL point-to-point and "
           "collectives on their own streams (no NVLink multicast): the --tp-comm-overlap schedule, plus the output layer";
  if (plan.source == TpOverlapSource::kCoc)
    return "--use-ascend-coc: MindSpeed's communication-over-computation pieces run on NVIDIA GPUs as fp8tron's pipelined "
           "NCCL collectives, one per piece, issued as the previous piece's GEMM runs";
  return "";
}

}  // namespace fp8tron
