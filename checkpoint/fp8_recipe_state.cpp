#include "checkpoint/fp8_recipe_state.h"

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "fp8/fp8_engine.h"

namespace fp8tron {

std::vector<torch::Tensor> read_fp8_recipe_state(const TrainingState& s,
                                                 const std::function<torch::Tensor(const fp8::Fp8Site&)>& saved) {
  std::vector<torch::Tensor> out;
  if (!s.fp8) return out;
  int64_t restored = 0;
  for (const auto& site : s.fp8->sites()) {
    out.push_back(saved(*site));
    restored += out.back().defined();
  }
  const int64_t missing = int64_t(out.size()) - restored;
  if (restored > 0 && missing > 0)
    throw UserError(strprintf("checkpoint holds the FP8 recipe state of %lld linear layers but not of %lld others; "
                              "was it saved with another --first-last-layers-bf16 / --fp8-min-features?",
                              (long long)restored, (long long)missing));
  return out;
}

void restore_fp8_recipe_state(const TrainingState& s, const std::vector<torch::Tensor>& states) {
  if (!s.fp8) return;
  const auto& sites = s.fp8->sites();
  FP8TRON_CHECK(states.size() == sites.size(), "FP8 recipe states read for another set of linear layers");
  bool restored = false;
  for (size_t i = 0; i < sites.size(); ++i)
    if (states[i].defined()) s.fp8->load_site_state(*sites[i], states[i]), restored = true;
  if (!restored && fp8::recipe_kind(s.fp8->recipe()) == fp8::RecipeKind::kDelayed)
    log::info(" > the checkpoint holds no FP8 delayed-scaling state: scales start from 1, as in a new run");
}

}  // namespace fp8tron
