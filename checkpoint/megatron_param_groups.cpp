#include "checkpoint/megatron_param_groups.h"

#include <algorithm>

#include "checkpoint/rank_agreement.h"
#include "checkpoint/saved_tensors.h"
#include "core/text.h"

namespace fp8tron {
namespace {

std::string encode(const MegatronParamGroup& g) {
  return strprintf("%d%d%d%d", int(g.expert), int(g.no_decay), int(g.lr_group), int(g.scaled_eps));
}

MegatronParamGroup decode(const std::string& text) {
  return MegatronParamGroup{text[0] == '1', text[1] == '1', LrGroup(text[2] - '0'), text[3] == '1'};
}

// The groups of this rank's parameters.
std::vector<MegatronParamGroup> local_groups(const TrainingState& s) {
  const OptimizerConfig& o = s.config.optimizer;
  std::vector<MegatronParamGroup> out;
  for (const auto& domain : s.optimizer.domains())
    for (const Slot& slot : domain->param_slots()) {
      const int64_t dim = int64_t(slot.info.global_shape.size());
      const MegatronParamGroup g{domain->groups().name == "expert", !applies_weight_decay(slot.name, dim, o),
                                 lr_group(slot.name, dim, o), adam_eps_mult(slot.name, dim, o) != 1.0};
      if (std::find(out.begin(), out.end(), g) == out.end()) out.push_back(g);
    }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, double>> megatron_group_overrides(const MegatronParamGroup& g,
                                                                     const OptimizerConfig& o) {
  std::vector<std::pair<std::string, double>> out;
  if (g.scaled_eps) out.emplace_back("eps", o.adam_eps * *mup_lr_mult(o));
  if (g.lr_group == LrGroup::Decoupled) {
    out.emplace_back("max_lr", *o.decoupled_lr);
    if (o.decoupled_min_lr) out.emplace_back("min_lr", *o.decoupled_min_lr);
  } else if (g.lr_group == LrGroup::Mup) {
    out.emplace_back("max_lr", o.lr * *mup_lr_mult(o));
    out.emplace_back("min_lr", o.min_lr * *mup_lr_mult(o));
  }
  if (g.no_decay) out.emplace_back("wd_mult", 0.0);
  return out;  // sorted by key, as param_group_override_to_tuple sorts them
}

std::vector<MegatronParamGroup> gather_megatron_param_groups(const TrainingState& s) {
  std::string mine;
  for (const MegatronParamGroup& g : local_groups(s)) mine += encode(g);
  std::vector<MegatronParamGroup> out;
  for (const std::string& rank : all_gather_strings(s.parallel, s.device, mine))
    for (size_t i = 0; i + 4 <= rank.size(); i += 4) {
      const MegatronParamGroup g = decode(rank.substr(i, 4));
      if (std::find(out.begin(), out.end(), g) == out.end()) out.push_back(g);
    }
  // Megatron's sort key: (has overrides, the overrides). Within the dense or the expert groups
  // no two have the same overrides, so their order is the sort's alone.
  const OptimizerConfig& o = s.config.optimizer;
  std::stable_sort(out.begin(), out.end(), [&](const MegatronParamGroup& a, const MegatronParamGroup& b) {
    const auto ka = megatron_group_overrides(a, o), kb = megatron_group_overrides(b, o);
    return std::make_pair(!ka.empty(), ka) < std::make_pair(!kb.empty(), kb);
  });
  return out;
}

}  // namespace fp8tron
