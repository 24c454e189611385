#include "trainer/cli/mup_args.h"

#include <cmath>

#include "core/error.h"

namespace fp8tron {

MupConfig build_mup_config(const FlagValues& f, const ModelConfig& m) {
  MupConfig u;
  u.enabled = f.get_bool("use-mup");
  u.embedding_mult = f.get_float("mup-embedding-mult");
  u.output_mult = f.get_float("mup-output-mult");
  u.base_head_dim = f.opt_float("mup-base-head-dim");
  u.attn_scale_power = f.get_float("mup-attn-scale-power");
  if (!u.enabled) return u;  // the --mup-* flags then do nothing (a start-up warning says so)
  u.base_hidden_size = f.opt_int("mup-base-hidden-size").value_or(m.hidden_size);
  if (u.base_hidden_size <= 0) throw UserError("--mup-base-hidden-size must be positive (the base model's --hidden-size)");
  u.width_mult = double(m.hidden_size) / double(u.base_hidden_size);
  if (u.base_head_dim && !(*u.base_head_dim > 0))
    throw UserError("--mup-base-head-dim must be positive (the base model's head dimension, e.g. 64)");
  // Megatron's __post_init__: 1/d_head attention (power 1), anchored at the base head dimension.
  u.softmax_scale = (u.base_head_dim ? std::sqrt(*u.base_head_dim) : 1.0) / std::pow(double(m.kv_channels), u.attn_scale_power);
  // Left at its default, the output multiplier keeps the logits O(1) across widths.
  if (u.output_mult == 1.0 && u.width_mult != 1.0) u.output_mult = 1.0 / u.width_mult;
  return u;
}

std::vector<std::string> mup_optimizer_warnings(const MupConfig& mup, const OptimizerConfig& o) {
  std::vector<std::string> out;
  if (!mup.enabled) return out;
  if (o.decoupled_lr) {
    std::string line =
        "Both decoupled_lr and MuP LR scaling are enabled. decoupled_lr sets an absolute LR for embedding+output params, "
        "and MuP LR scaling will not override those parameters.";
    if (o.optimizer == "adam") line += " MuP Adam epsilon scaling remains applied to hidden matrix-like parameters.";
    out.push_back(line);
  }
  if (o.optimizer == "muon" && o.muon.scale_mode == "spectral")
    out.push_back("Both MuP and muon_scale_mode=spectral are enabled. Muon-managed matrix parameters will continue using "
                  "spectral Muon scaling. Set --muon-scale-mode unit_rms_norm to use unit_rms_norm scaling for "
                  "Muon-managed matrices with MuP.");
  return out;
}

}  // namespace fp8tron
