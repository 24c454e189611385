// The FP8 engine of a model chunk (fp8_engine.h): its sites, the delayed-scaling state and its
// update at the end of a step, checkpoints of the recipe state, cast statistics, the GEMM handle
// and the backward kernels the casts fuse.
#include "fp8/fp8_engine.h"

#include <ATen/cuda/CUDAContext.h>

#include "core/error.h"
#include "core/text.h"
#include "fp8/gemm.h"
#include "fp8/quantized_tensor.h"
#include "fp8/scaling_state.h"

namespace fp8tron::fp8 {

namespace {

constexpr size_t kRolesPerSite = DelayedScalingState::kForwardRoles + DelayedScalingState::kBackwardRoles;
constexpr TensorRole kRoles[kRolesPerSite] = {TensorRole::kInput, TensorRole::kWeight, TensorRole::kOutput,
                                              TensorRole::kGradOutput, TensorRole::kGradInput};
constexpr float kStepSplit = 1048576.0f;  // steps are stored as two floats (exact up to 2^44)

}  // namespace

Fp8Engine::Fp8Engine(const Fp8EngineOptions& options, torch::Device device)
    : options_(options), device_(device), attention_(device) {
  validate(options_.recipe);
  if (device_.is_cuda()) {
    const auto* props = at::cuda::getDeviceProperties(device_.index());
    emulated_ = !runs_natively(options_.recipe, props->major);
  }
}

Fp8Engine::~Fp8Engine() = default;

std::shared_ptr<Fp8Site> Fp8Engine::add_site(const std::string& name, int64_t layer, int64_t out_features,
                                             int64_t in_features) {
  FP8TRON_CHECK(!history_.defined(), "FP8 sites must all be registered before the first forward pass");
  const auto& o = options_;
  const bool edge_layer = bf16_layer(layer);
  const bool small = std::min(out_features, in_features) < o.min_features;
  // FP8 GEMMs need leading dimensions that are multiples of 16 (block scaling: of 128 is not
  // needed, partial blocks are handled).
  const bool misaligned = out_features % 16 != 0 || in_features % 16 != 0;
  if (edge_layer || small || misaligned) {
    ++bf16_sites_;
    return nullptr;
  }
  auto site = std::make_shared<Fp8Site>();
  site->engine = this;
  site->name = name;
  site->index = sites_.size();
  site->out_features = out_features;
  site->in_features = in_features;
  sites_.push_back(site);
  return site;
}

std::shared_ptr<Fp8AttentionSite> Fp8Engine::add_attention_site(const std::string& name, int64_t layer) {
  if (!options_.dot_product_attention || bf16_layer(layer)) return nullptr;
  return attention_.add_site(name);
}

bool Fp8Engine::bf16_layer(int64_t layer) const {
  const auto& o = options_;
  return layer >= 0 && (layer < o.bf16_first_layers || layer >= o.num_layers - o.bf16_last_layers);
}

void Fp8Engine::ensure_state() {
  if (history_.defined() || recipe_kind(options_.recipe) != RecipeKind::kDelayed) return;
  const auto& d = std::get<DelayedScaling>(options_.recipe);
  const int64_t slots = int64_t(sites_.size() * kRolesPerSite);
  const auto floats = torch::TensorOptions().device(device_).dtype(torch::kFloat32);
  history_ = torch::zeros({d.amax_history_len, slots}, floats);
  scale_ = torch::ones({slots}, floats);  // TE starts from scale 1
  scale_inv_ = torch::ones({slots}, floats);
}

size_t Fp8Engine::slot(const Fp8Site& site, TensorRole role) const {
  return DelayedScalingState::slot(sites_.size(), site.index, role);
}

Fp8Engine::StepState Fp8Engine::capture_step_state() {
  StepState s;
  s.steps = steps_;
  s.attention = attention_.capture();
  if (recipe_kind(options_.recipe) == RecipeKind::kDelayed && !sites_.empty()) {
    ensure_state();
    s.history = history_.clone();
    s.scale = scale_.clone();
    s.scale_inv = scale_inv_.clone();
  }
  return s;
}

void Fp8Engine::restore_step_state(const StepState& s) {
  steps_ = s.steps;
  attention_.restore(s.attention);
  if (s.history.defined()) {
    history_.copy_(s.history);
    scale_.copy_(s.scale);
    scale_inv_.copy_(s.scale_inv);
  }
  stats_.clear();
  ++weight_generation_;
}

void Fp8Engine::end_step(const AmaxReducer& reduce, const AmaxReducer& reduce_attention) {
  ++weight_generation_;
  ++steps_;
  attention_.end_step(reduce_attention);
  if (recipe_kind(options_.recipe) != RecipeKind::kDelayed || sites_.empty()) return;
  ensure_state();
  const auto& d = std::get<DelayedScaling>(options_.recipe);
  if (steps_ % uint64_t(d.interval) != 0) return;  // row 0 keeps accumulating over the interval
  if (reduce && d.reduce_amax) {
    auto current = history_[0];  // contiguous: every slot's amax of this interval
    reduce(current);
  }
  const ScalingBuffers buffers{history_.data_ptr<float>(), scale_.data_ptr<float>(), scale_inv_.data_ptr<float>(),
                               size_t(history_.size(0)), size_t(history_.size(1))};
  const auto params = delayed_update_params(d, sites_.size());
  if (device_.is_cuda()) {
    update_delayed_scaling_cuda(buffers, params, current_stream(device_));
  } else {
    update_delayed_scaling_cpu(buffers, params);
  }
}

torch::Tensor Fp8Engine::site_state(const Fp8Site& site) {
  if (recipe_kind(options_.recipe) != RecipeKind::kDelayed) return {};
  ensure_state();
  std::vector<int64_t> slots;
  for (TensorRole role : kRoles) slots.push_back(int64_t(slot(site, role)));
  auto index = torch::tensor(slots, torch::kInt64).to(device_);
  auto history = history_.index_select(1, index).reshape({-1});
  const uint64_t split = uint64_t(kStepSplit);
  auto header = torch::tensor({float(steps_ % split), float(steps_ / split)}, torch::kFloat32);
  return torch::cat({header, history.cpu(), scale_.index_select(0, index).cpu(), scale_inv_.index_select(0, index).cpu()});
}

void Fp8Engine::load_site_state(const Fp8Site& site, const torch::Tensor& state) {
  if (recipe_kind(options_.recipe) != RecipeKind::kDelayed) return;
  ensure_state();
  const int64_t roles = int64_t(kRolesPerSite), n = state.numel();
  const int64_t saved_len = (n - 2 - 2 * roles) / roles;
  if (state.dim() != 1 || saved_len < 1 || n != 2 + saved_len * roles + 2 * roles)
    throw UserError(strprintf("checkpoint: the FP8 recipe state of %s has %lld values, which is not a delayed-scaling "
                              "state (2 + history_len x 5 + 10)",
                              site.name.c_str(), (long long)n));
  auto s = state.to(torch::kFloat32).cpu().contiguous();
  const float* v = s.data_ptr<float>();
  steps_ = uint64_t(v[0]) + uint64_t(v[1]) * uint64_t(kStepSplit);
  auto saved = s.narrow(0, 2, saved_len * roles).view({saved_len, roles});
  const int64_t len = history_.size(0);
  auto restored = torch::zeros({len, roles}, torch::kFloat32);
  restored[0].copy_(saved[0]);  // the amax being recorded
  const int64_t keep = std::min(len, saved_len) - 1;  // the most recent completed steps
  if (keep > 0) restored.narrow(0, len - keep, keep).copy_(saved.narrow(0, saved_len - keep, keep));
  std::vector<int64_t> slots;
  for (TensorRole role : kRoles) slots.push_back(int64_t(slot(site, role)));
  auto index = torch::tensor(slots, torch::kInt64).to(device_);
  history_.index_copy_(1, index, restored.to(device_));
  scale_.index_copy_(0, index, s.narrow(0, 2 + saved_len * roles, roles).to(device_));
  scale_inv_.index_copy_(0, index, s.narrow(0, 2 + saved_len * roles + roles, roles).to(device_));
}

void Fp8Engine::record_stats(const Fp8Site& site, TensorRole role, Format format, const torch::Tensor& values,
                             const torch::Tensor& codes) {
  torch::NoGradGuard no_grad;
  auto& entry = stats_[{site.index, int(role)}];
  if (!entry.defined()) entry = torch::zeros({4}, torch::TensorOptions().device(device_).dtype(torch::kFloat64));
  // Magnitude codes: 0 is zero; the largest finite is 0x7E in E4M3 (448), 0x7B in E5M2 (57344).
  const auto magnitude = torch::bitwise_and(codes, 0x7F);
  const int top = format == Format::kE4M3 ? 0x7E : format == Format::kE5M2 ? 0x7B : -1;
  const auto v = values.to(torch::kFloat32);
  auto add = torch::stack({v.abs().max().to(torch::kFloat64),
                           (magnitude == 0).logical_and(v != 0).sum().to(torch::kFloat64),
                           top < 0 ? torch::zeros({}, entry.options()) : (magnitude == top).sum().to(torch::kFloat64),
                           torch::full({}, double(v.numel()), entry.options())});
  entry.copy_(torch::stack({torch::maximum(entry[0], add[0]), entry[1] + add[1], entry[2] + add[2], entry[3] + add[3]}));
}

std::vector<Fp8Engine::CastStats> Fp8Engine::take_stats() {
  std::vector<CastStats> out;
  for (const auto& [key, values] : stats_) {
    const auto host = values.cpu();
    const double* x = host.data_ptr<double>();
    out.push_back({sites_[key.first]->name, TensorRole(key.second), x[0], x[1], x[2], x[3]});
  }
  stats_.clear();
  return out;
}

GemmHandle& Fp8Engine::gemm_handle() {
  if (!gemm_) {
    GemmHandleOptions o;
    o.algo_selection = options_.autotune_gemms ? AlgoSelection::kAutotune : AlgoSelection::kHeuristic;
    gemm_ = std::make_unique<GemmHandle>(o);
  }
  return *gemm_;
}

void Fp8Engine::use_backward_kernels(NormBackwardFn norm, SwigluBackwardFn swiglu) {
  if (norm) norm_backward_ = norm;
  if (swiglu) swiglu_backward_ = swiglu;
}

NormBackwardGrads Fp8Engine::norm_backward(const NormBackwardInputs& in) const {
  return norm_backward_ ? norm_backward_(in) : torch_norm_backward(in);
}

torch::Tensor Fp8Engine::swiglu_backward(const torch::Tensor& grad, const torch::Tensor& h) const {
  return swiglu_backward_ ? swiglu_backward_(grad, h) : torch_swiglu_backward(grad, h);
}

std::string Fp8Engine::describe() const {
  const char* where = !device_.is_cuda() ? "CPU emulation (reference quantizers, fp32 GEMMs)"
                      : emulated_        ? "GPU emulation (quantize, dequantize, bf16 GEMMs)"
                                         : "FP8 tensor cores (cuBLASLt)";
  std::string s = strprintf("FP8: %s; %s; %zu linear layers in FP8", fp8::describe(options_.recipe).c_str(), where,
                            sites_.size());
  if (bf16_sites_ > 0)
    s += strprintf(", %lld kept in bf16 (--first-last-layers-bf16, --fp8-min-features %lld, or features not a multiple "
                   "of 16)",
                   (long long)bf16_sites_, (long long)options_.min_features);
  return s;
}

}  // namespace fp8tron::fp8
