#include "checkpoint/scheduler_state.h"

#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"

namespace fp8tron {
namespace ck = checkpoint;
namespace {

const char* decay_style_name(DecayStyle s) {
  switch (s) {
    case DecayStyle::Constant: return "constant";
    case DecayStyle::Linear: return "linear";
    case DecayStyle::Cosine: return "cosine";
    case DecayStyle::InverseSquareRoot: return "inverse-square-root";
    case DecayStyle::WSD: return "WSD";
  }
  return "?";
}

const char* wd_style_name(WeightDecayIncrStyle s) {
  switch (s) {
    case WeightDecayIncrStyle::Constant: return "constant";
    case WeightDecayIncrStyle::Linear: return "linear";
    case WeightDecayIncrStyle::Cosine: return "cosine";
  }
  return "?";
}

DecayStyle parse_decay_style(const std::string& v, const std::string& path) {
  for (auto s : {DecayStyle::Constant, DecayStyle::Linear, DecayStyle::Cosine, DecayStyle::InverseSquareRoot, DecayStyle::WSD})
    if (v == decay_style_name(s)) return s;
  throw UserError("checkpoint " + path + " has an unknown learning-rate decay style '" + v + "'");
}

WeightDecayIncrStyle parse_wd_style(const std::string& v, const std::string& path) {
  for (auto s : {WeightDecayIncrStyle::Constant, WeightDecayIncrStyle::Linear, WeightDecayIncrStyle::Cosine})
    if (v == wd_style_name(s)) return s;
  throw UserError("checkpoint " + path + " has an unknown weight-decay increment style '" + v + "'");
}

// The shortest text that reads back as `v` (0.003, not 0.0030000000000000001).
std::string text(double v) {
  for (int digits = 6; digits < 17; ++digits) {
    std::string t = strprintf("%.*g", digits, v);
    if (std::strtod(t.c_str(), nullptr) == v) return t;
  }
  return strprintf("%.17g", v);
}
std::string text(int64_t v) { return std::to_string(v); }
std::string text(const std::string& v) { return v; }

}  // namespace

ck::SchedulerState scheduler_state(const LrScheduleConfig& c) {
  ck::SchedulerState s;
  s.max_lr = c.max_lr;
  s.min_lr = c.min_lr;
  s.lr_warmup_steps = c.warmup_steps;
  s.lr_decay_steps = c.decay_steps;
  s.lr_decay_style = decay_style_name(c.decay_style);
  s.start_wd = c.start_wd;
  s.end_wd = c.end_wd;
  s.wd_incr_steps = c.wd_incr_steps;
  s.wd_incr_style = wd_style_name(c.wd_incr_style);
  return s;
}

LrScheduleConfig resolve_schedule(const LrScheduleConfig& mine, const ck::SchedulerState& saved, SchedulerSource source,
                                  const std::string& path) {
  const ck::SchedulerState here = scheduler_state(mine);
  std::vector<std::string> differences;
  // Megatron's _check_and_set, value by value, with its names.
  auto check = [&](const char* name, const char* flags, const auto& mine_value, const auto& saved_value) {
    if (source == SchedulerSource::kCommandLine) {
      log::info(std::string(" > overriding ") + name + " value to " + text(mine_value));
      return;
    }
    if (source == SchedulerSource::kMustMatch && !(mine_value == saved_value))
      differences.push_back(strprintf("%s is %s in the checkpoint but %s here (%s)", name, text(saved_value).c_str(),
                                      text(mine_value).c_str(), flags));
    log::info(std::string(" > using checkpoint value ") + text(saved_value) + " for " + name);
  };
  check("learning rate", "--lr", here.max_lr, saved.max_lr);
  check("minimum learning rate", "--min-lr", here.min_lr, saved.min_lr);
  check("warmup iterations", "--lr-warmup-iters/-samples/-fraction (in samples)", here.lr_warmup_steps, saved.lr_warmup_steps);
  check("total number of iterations", "--lr-decay-iters/-samples, default --train-iters/-samples (in samples)",
        here.lr_decay_steps, saved.lr_decay_steps);
  check("learning rate decay style", "--lr-decay-style", here.lr_decay_style, saved.lr_decay_style);
  check("start weight decay", "--start-weight-decay or --weight-decay", here.start_wd, saved.start_wd);
  check("end weight decay", "--end-weight-decay or --weight-decay", here.end_wd, saved.end_wd);
  check("total number of weight decay iterations", "--train-iters/-samples (in samples)", here.wd_incr_steps,
        saved.wd_incr_steps);
  check("weight decay incr style", "--weight-decay-incr-style", here.wd_incr_style, saved.wd_incr_style);
  if (!differences.empty())
    throw UserError("the optimizer schedule differs from the one checkpoint " + path + " was saved with: " +
                    join(differences, "; ") +
                    "; pass --override-opt-param-scheduler to use this run's values, or "
                    "--use-checkpoint-opt_param-scheduler to continue with the checkpoint's");
  if (source != SchedulerSource::kCheckpoint) return mine;
  LrScheduleConfig out = mine;
  out.max_lr = saved.max_lr;
  out.min_lr = saved.min_lr;
  out.warmup_steps = saved.lr_warmup_steps;
  out.decay_steps = saved.lr_decay_steps;
  out.decay_style = parse_decay_style(saved.lr_decay_style, path);
  out.start_wd = saved.start_wd;
  out.end_wd = saved.end_wd;
  out.wd_incr_steps = saved.wd_incr_steps;
  out.wd_incr_style = parse_wd_style(saved.wd_incr_style, path);
  if (out.decay_style == DecayStyle::WSD && out.wsd_decay_steps <= 0)
    throw UserError("checkpoint " + path + " decays the learning rate with WSD: give --lr-wsd-decay-iters (or -samples)");
  return out;
}

}  // namespace fp8tron
