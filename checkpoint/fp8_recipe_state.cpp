#include "checkpoint/fp8_recipe_state.h"

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "fp8/fp8_engine.h"

namespace fp8tron {

void restore_fp8_recipe_state(const TrainingState& s, const std::function<torch::Tensor(const fp8::Fp8Site&)>& saved) {
  if (!s.fp8) return;
  int64_t restored = 0, missing = 0;
  for (const auto& site : s.fp8->sites()) {
    const torch::Tensor state = saved(*site);
    if (!state.defined()) {
      ++missing;
      continue;
    }
    s.fp8->load_site_state(*site, state);
    ++restored;
  }
  if (restored > 0 && missing > 0)
    throw UserError(strprintf("checkpoint holds the FP8 recipe state of %lld linear layers but not of %lld others; "
                              "was it saved with another --first-last-layers-bf16 / --fp8-min-features?",
                              (long long)restored, (long long)missing));
  if (restored == 0 && fp8::recipe_kind(s.fp8->recipe()) == fp8::RecipeKind::kDelayed)
    log::info(" > the checkpoint holds no FP8 delayed-scaling state: scales start from 1, as in a new run");
}

}  // namespace fp8tron
