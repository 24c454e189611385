#include "fp8/fp8_grouped_linear.h"

#include <ATen/ExpandUtils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <functional>
#include <numeric>

#include "core/error.h"
#include "core/cuda/cuda_check.h"
#include "fp8/held_wgrad.h"
#include "fp8/forward_replay.h"
#include "fp8/gemm.h"
#include "fp8/grouped_gemm.h"
#include "fp8/packed_rows.h"
#include "fp8/quantized_tensor.h"
#include "fp8/swiglu_backward.h"

namespace fp8tron::fp8 {

using torch::autograd::variable_list;

namespace {

using Splits = std::vector<int64_t>;

std::vector<int64_t> row_begins(const Splits& splits) {
  std::vector<int64_t> begin(splits.size() + 1, 0);
  for (size_t e = 0; e < splits.size(); ++e) begin[e + 1] = begin[e] + splits[e];
  return begin;
}

bool is_bf16(const torch::Tensor& t) { return t.scalar_type() == torch::kBFloat16; }

// The fp32 main gradient the wgrad GEMM may write into (gradient-accumulation fusion), or undefined.
torch::Tensor main_grad_of(const torch::Tensor& weight_param, bool fusion) {
  if (!weight_param.defined() || !weight_param.is_cuda() || !fusion) return {};
  torch::Tensor g = weight_param.grad();
  const bool ok = g.defined() && g.scalar_type() == torch::kFloat32 && g.is_contiguous() &&
                  g.sizes() == weight_param.sizes();
  return ok ? g : torch::Tensor();
}

// The gradient of a parameter that got none from a GEMM (an expert without tokens): zero. With a
// gradient already there, adding zero changes nothing, so none is returned (AccumulateGrad's hooks
// still run).
torch::Tensor idle_grad(const torch::Tensor& param, torch::IntArrayRef sizes, const torch::TensorOptions& options) {
  if (param.defined() && param.grad().defined()) return {};
  return torch::zeros(sizes, options);
}

RowMajorMatrix bf16_rows(const torch::Tensor& t) {  // a contiguous bf16 [rows, cols] tensor
  return {t.data_ptr(), DType::kBF16, t.size(0), t.size(1), t.size(1), nullptr, ScalingMode::kTensor};
}

GemmConfig bucketed(GemmBucket bucket) {
  GemmConfig c;
  c.bucket = bucket;
  return c;
}

// ---- bf16 GEMMs ------------------------------------------------------------------------------------

// One expert's GEMM, in both forms: the cuBLASLt problem and the equivalent at::mm call.
struct Bf16Job {
  GroupedGemm lt;
  std::function<void()> aten;
  double work = 0;
};

void run_bf16_jobs(const std::vector<Bf16Job>& jobs, bool cublas_lt, const torch::Device& device) {
  if (jobs.empty()) return;
  GroupedGemmResources& res = grouped_gemm_resources();
  const CudaStream main = current_stream(device);
  if (cublas_lt) {
    std::vector<GroupedGemm> gemms;
    for (const Bf16Job& j : jobs) gemms.push_back(j.lt);
    grouped_gemm(res.handle, res.streams, gemms, main);
    return;
  }
  FanOut fan(res.streams, main, jobs.size());
  for (const Bf16Job& j : jobs) {
    const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(fan.stream_for(j.work), device.index()));
    j.aten();
  }
}

// The backend of the bf16 grouped GEMMs: cuBLASLt with the bucketed plans unless at::mm is asked
// for. The GPU times are close (at::mm 0-8% faster per expert GEMM at Mixtral-like shapes, and more
// with skewed routing, scripts/bench_grouped_gemm.sh), but at::mm runs cuBLAS's own heuristics on
// the host for every token count it has not seen, about 250 us per GEMM on an H200's host, and
// routing gives new counts every step: measured 36 ms per Mixtral-style step (196 GEMMs) of GPU
// idle behind them. Timing both in place, as this once did, repeats one shape and cannot see it.
bool uses_cublas_lt(bool lt_ok, Bf16GroupedBackend forced) {
  return lt_ok && forced != Bf16GroupedBackend::kAtenMm;
}

// y[rows of e] = x[rows of e] W_e^T (+ b_e).
torch::Tensor bf16_forward(const torch::Tensor& x, const Splits& splits, const std::vector<torch::Tensor>& w,
                           const std::vector<torch::Tensor>& b, Bf16GroupedBackend forced) {
  const int64_t out_features = w[0].size(0);
  auto y = torch::empty({x.size(0), out_features}, x.options());
  const auto begin = row_begins(splits);
  std::vector<Bf16Job> jobs;
  bool lt_ok = x.is_cuda() && is_bf16(x);
  for (size_t e = 0; e < w.size(); ++e) {
    lt_ok = lt_ok && is_bf16(w[e]) && (!b[e].defined() || is_bf16(b[e]));
    if (splits[e] == 0) continue;
    const torch::Tensor xe = x.narrow(0, begin[e], splits[e]);
    torch::Tensor ye = y.narrow(0, begin[e], splits[e]);
    const torch::Tensor we = w[e], be = b[e].defined() ? b[e].contiguous() : b[e];
    Bf16Job j;
    j.aten = [xe, ye, we, be]() mutable { be.defined() ? at::addmm_out(ye, be, xe, we.t()) : at::mm_out(ye, xe, we.t()); };
    j.work = double(splits[e]);
    if (x.is_cuda() && is_bf16(x) && is_bf16(we) && (!be.defined() || is_bf16(be))) {
      j.lt.problem = nt_problem(bf16_rows(xe), bf16_rows(we), ye.data_ptr(), DType::kBF16, out_features);
      j.lt.config = bucketed(GemmBucket::kN);
      j.lt.config.bias = be.defined() ? be.data_ptr() : nullptr;
    }
    jobs.push_back(std::move(j));
  }
  if (!x.is_cuda()) {  // F::linear's addmm, bit for bit
    for (const Bf16Job& j : jobs) j.aten();
    return y;
  }
  run_bf16_jobs(jobs, uses_cublas_lt(lt_ok, forced), x.device());
  return y;
}

// dx[rows of e] = dy[rows of e] W_e.
torch::Tensor bf16_dgrad(const torch::Tensor& dy, const Splits& splits, const std::vector<torch::Tensor>& w,
                         Bf16GroupedBackend forced) {
  const int64_t in_features = w[0].size(1), out_features = w[0].size(0);
  auto dx = torch::empty({dy.size(0), in_features}, dy.options());
  const auto begin = row_begins(splits);
  std::vector<Bf16Job> jobs;
  bool lt_ok = dy.is_cuda() && is_bf16(dy);
  for (size_t e = 0; e < w.size(); ++e) {
    lt_ok = lt_ok && is_bf16(w[e]);
    if (splits[e] == 0) continue;
    const torch::Tensor dye = dy.narrow(0, begin[e], splits[e]);
    torch::Tensor dxe = dx.narrow(0, begin[e], splits[e]);
    const torch::Tensor we = w[e];
    Bf16Job j;
    j.aten = [dye, dxe, we]() mutable { at::mm_out(dxe, dye, we); };
    j.work = double(splits[e]);
    if (lt_ok) {
      // Column-major: dX^T [K x m] = W^T [K x N] (W row-major [N, K]) * dY^T [N x m].
      j.lt.problem.a = GemmOperand{we.data_ptr(), DType::kBF16, in_features, out_features, in_features, false};
      j.lt.problem.b = GemmOperand{dye.data_ptr(), DType::kBF16, out_features, splits[e], out_features, false};
      j.lt.problem.d = GemmOutput{dxe.data_ptr(), DType::kBF16, in_features};
      j.lt.config = bucketed(GemmBucket::kN);
    }
    jobs.push_back(std::move(j));
  }
  if (!dy.is_cuda()) {  // addmm's mat1 backward, bit for bit
    for (const Bf16Job& j : jobs) j.aten();
    return dx;
  }
  run_bf16_jobs(jobs, uses_cublas_lt(lt_ok, forced), dy.device());
  return dx;
}

// ---- FP8 GEMMs -------------------------------------------------------------------------------------

// Rows of an output [total rows, width] that the experts' fprop or dgrad GEMMs write. With padding
// (a segment's rows not a multiple of 16, or 32 for MXFP8), the GEMMs run over the padded rows
// into `padded`, gathered into `out` after the GEMMs: cuBLASLt's FP8 GEMMs refuse token counts
// that are not multiples of 16 (CUBLAS_STATUS_NOT_SUPPORTED on an H200, even for tensor scaling).
struct RowOutput {
  torch::Tensor out, padded;
};

// `into`: the [total rows, width] tensor to write (undefined: a new one).
RowOutput row_output(const QuantizedSegments& a, int64_t width, const torch::TensorOptions& options,
                     const torch::Tensor& into = {}) {
  RowOutput r;
  r.out = into.defined() ? into : torch::empty({int64_t(a.layout.total_rows()), width}, options);
  if (a.layout.padding()) r.padded = torch::empty({int64_t(a.layout.total_padded()), width}, options);
  return r;
}

// Appends out[rows of e] = A_e B_e^T (+ bias_e) for every expert with rows: A_e segment e of `a`
// (row-wise copy), B_e = b(e) as gemm_nt's W.
void add_row_products(const QuantizedSegments& a, const std::function<RowMajorMatrix(size_t)>& b,
                      const std::vector<torch::Tensor>& bias_bf16, bool fast_accumulation, RowOutput& r,
                      std::vector<GroupedGemm>& gemms) {
  const SegmentLayout& l = a.layout;
  const int64_t width = r.out.size(1);
  for (size_t e = 0; e < l.segments(); ++e) {
    if (l.rows[e] == 0) continue;
    RowMajorMatrix am = rowwise_matrix(a.segment(e));
    void* out = nullptr;
    if (r.padded.defined()) {
      out = static_cast<uint16_t*>(r.padded.data_ptr()) + l.row_begin[e] * size_t(width);
    } else {
      out = static_cast<uint16_t*>(r.out.data_ptr()) + l.src_begin[e] * size_t(width);
    }
    GroupedGemm g;
    g.problem = nt_problem(am, b(e), out, DType::kBF16, width);
    g.config = bucketed(GemmBucket::kN);
    g.config.fast_accumulation = fast_accumulation;
    if (!bias_bf16.empty() && bias_bf16[e].defined()) g.config.bias = bias_bf16[e].data_ptr();
    gemms.push_back(g);
  }
}

// The real rows of a padded output (after the GEMMs), one copy.
void gather_rows(const QuantizedSegments& a, RowOutput& r) {
  if (!r.padded.defined()) return;
  const SegmentLayout& l = a.layout;
  std::vector<torch::Tensor> parts;
  for (size_t e = 0; e < l.segments(); ++e)
    if (l.rows[e] > 0) parts.push_back(r.padded.narrow(0, int64_t(l.row_begin[e]), int64_t(l.rows[e])));
  if (!parts.empty()) at::cat_out(r.out, parts, 0);
  r.padded = torch::Tensor();
}

// Emulated / CPU: one expert's A B^T (+ bias) on the dequantized copies, as fp8_linear's gemm().
torch::Tensor high_precision_product(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& bias) {
  return bias.defined() ? torch::addmm(bias.to(a.scalar_type()), a, b.t()) : torch::mm(a, b.t());
}

std::vector<torch::Tensor> bf16_biases(const std::vector<torch::Tensor>& biases) {
  std::vector<torch::Tensor> out;
  for (const auto& b : biases) out.push_back(b.defined() ? b.detach().to(torch::kBFloat16).contiguous() : b);
  return out;
}

struct Fp8Forward {
  torch::Tensor y;
  std::shared_ptr<QuantizedSegments> input;
  std::vector<std::shared_ptr<Quantized>> weights;
};

Fp8Forward fp8_forward(const torch::Tensor& x, const Splits& splits, const std::vector<torch::Tensor>& weights,
                       const std::vector<torch::Tensor>& biases, const std::vector<Fp8Site*>& sites, bool need_dw,
                       bool record_amax, Prologue prologue, const torch::Tensor& packed_x) {
  Fp8Engine& e = *sites[0]->engine;
  const Path path = path_of(e);
  Fp8Forward f;
  // Amaxes are recorded for training steps only: evaluation must not move the scales. Rows that
  // arrive quantized (packed_x, per-block recipes: no amaxes) keep their codes and scales.
  f.input = packed_x.defined()
                ? quantize_grouped_from_packed(e, sites, packed_x, x, splits, need_dw)
                : quantize_grouped(e, sites, TensorRole::kInput, x, splits, true, need_dw, record_amax, nullptr, prologue);
  f.weights.resize(sites.size());
  for (size_t i = 0; i < sites.size(); ++i)
    if (splits[i] > 0) f.weights[i] = quantized_weight(*sites[i], weights[i], record_amax);
  const QuantizedSegments& xq = *f.input;
  const int64_t out_features = weights[0].size(0);
  if (path == Path::kNative) {
    const auto bias = bf16_biases(biases);
    RowOutput r = row_output(xq, out_features, x.options().dtype(torch::kBFloat16));
    std::vector<GroupedGemm> gemms;
    add_row_products(xq, [&](size_t i) { return rowwise_matrix(f.weights[i]->view); }, bias,
                     use_fast_accumulation(e.recipe(), GemmKind::kFprop), r, gemms);
    GroupedGemmResources& res = grouped_gemm_resources();
    grouped_gemm(res.handle, res.streams, gemms, current_stream(x.device()));
    gather_rows(xq, r);
    f.y = r.out.to(x.scalar_type());
    return f;
  }
  f.y = torch::empty({x.size(0), out_features}, x.options());
  const SegmentLayout& l = xq.layout;
  for (size_t i = 0; i < sites.size(); ++i) {
    if (splits[i] == 0) continue;
    const auto p = high_precision_product(xq.dequantized_rows(i), f.weights[i]->dequantized,
                                          biases[i].defined() ? biases[i].detach() : biases[i]);
    f.y.narrow(0, int64_t(l.src_begin[i]), splits[i]).copy_(p.narrow(0, 0, splits[i]));
  }
  return f;
}

// ---- the autograd node -------------------------------------------------------------------------------

// Backward of grouped_linear. Inputs: x, weight 0..E-1, bias 0..E-1.
struct GroupedLinearBackward : public torch::autograd::Node {
  std::vector<Fp8Site*> sites;  // FP8; empty: bf16
  Splits splits;
  std::shared_ptr<QuantizedSegments> input;             // FP8: x's transposed copies (wgrad)
  std::vector<std::shared_ptr<Quantized>> weights_q;    // FP8: W_e (both copies) of experts with tokens
  torch::Tensor input_hp;                               // bf16: x (wgrad)
  torch::Tensor swiglu_input;                           // Prologue::kSwiglu: x = [gate | up] (dgrad)
  // The SwiGLU hand-over, as fp8_linear's: an fc2 with Prologue::kSwiglu whose x is this node's
  // output (fc1's h) hands back the gradient of the SwiGLU's output [rows, f] in the first rows * f
  // elements of a gradient shaped as h, [rows, 2f] (`swiglu_deferred`, on fc2's node), and this
  // node applies SwiGLU's backward inside its gradient cast (Prologue::kSwigluBackward), or first
  // where that cast does not apply. Holds h (`deferred_swiglu_input`, on fc1's node).
  torch::Tensor deferred_swiglu_input;
  bool swiglu_deferred = false;
  std::vector<torch::Tensor> weights;                   // bf16: W_e (dgrad)
  std::vector<torch::Tensor> weight_params;             // the leaf weights (main gradients)
  std::vector<torch::Tensor> bias_params;               // defined where the expert has a bias
  torch::ScalarType input_dtype = torch::kBFloat16, weight_dtype = torch::kBFloat16;
  torch::TensorOptions weight_options;
  int64_t in_features = 0, out_features = 0;
  Bf16GroupedBackend bf16_backend = Bf16GroupedBackend::kCublasLt;
  bool fusion = true;  // gradient-accumulation fusion: wgrads into the weights' fp32 main gradients
  // --delay-wgrad-compute: the weight gradients are held there (fp8/held_wgrad.h); null: computed
  // in the backward pass.
  std::shared_ptr<DeferredWork> wgrad_queue;
  std::vector<bool> want_dw_;  // the weights autograd wants gradients of, read when the backward ran

  size_t experts() const { return splits.size(); }
  std::string name() const override { return "GroupedLinearBackward"; }
  // Autograd releases a node's state right after its backward ran; held weight gradients still
  // read it, so their closure releases it once they ran.
  bool holding_ = false;
  void release_variables() override {
    if (!holding_) release_state();
  }
  void release_state() {
    input.reset();
    weights_q.clear();
    input_hp = torch::Tensor();
    swiglu_input = torch::Tensor();
    deferred_swiglu_input = torch::Tensor();
    packed_dx_ = torch::Tensor();
    weights.clear();
    weight_params.clear();
    bias_params.clear();
  }

  variable_list apply(variable_list&& grads) override {
    FP8TRON_CHECK(!weight_params.empty(), "GroupedLinearBackward ran twice (retain_graph is not supported)");
    variable_list out(1 + 2 * experts());
    if (!grads[0].defined()) return out;
    want_dw_.assign(experts(), false);
    for (size_t e = 0; e < experts(); ++e) want_dw_[e] = task_should_compute_output(1 + e);
    const torch::Tensor dy = grads[0].contiguous();
    sites.empty() ? bf16_backward(dy, out) : fp8_backward(dy, out);
    if (holds_wgrads()) holding_ = true;  // the held work releases the state
    else release_variables();
    return out;
  }

  // Whether the weight gradients go to the queue: every weight a leaf whose gradient is wanted
  // (the held work adds to the parameters themselves).
  bool holds_wgrads() const {
    if (!wgrad_queue || !any_dw()) return false;
    for (const auto& w : weight_params)
      if (!w.defined()) return false;
    return true;
  }
  // Runs `wgrads` (which fills the weights' entries of an output list) now into `out`, or holds it:
  // later it runs into a list of its own whose gradients are then added as AccumulateGrad would,
  // and releases what this node kept.
  void weight_grads(const std::function<void(GroupedLinearBackward&, variable_list&)>& wgrads, variable_list& out) {
    if (!holds_wgrads()) {
      wgrads(*this, out);
      return;
    }
    auto self = std::static_pointer_cast<GroupedLinearBackward>(shared_from_this());
    run_or_hold_wgrad(
        wgrad_queue,
        [self, wgrads] {
          variable_list w(1 + 2 * self->experts());
          wgrads(*self, w);
          for (size_t e = 0; e < self->experts(); ++e) accumulate_param_grad(self->weight_params[e], w[1 + e]);
          self->holding_ = false;
          self->release_state();
        },
        weight_params);
  }

  // swiglu_deferred: the gradient handed to fc1's node, [rows, 2f] with dX [rows, f] in its first
  // rows * f elements (the rest is never read). packed_rows() allocates it and returns the [rows, f]
  // view the dgrad GEMMs write; pack_for_producer copies a dX computed elsewhere into one.
  torch::Tensor packed_dx_;
  torch::Tensor packed_rows(const torch::Device& device) {
    const int64_t rows = std::accumulate(splits.begin(), splits.end(), int64_t{0});
    packed_dx_ = torch::empty({rows, 2 * in_features}, torch::TensorOptions().device(device).dtype(input_dtype));
    return packed_dx_.view(-1).narrow(0, 0, rows * in_features).view({rows, in_features});
  }
  torch::Tensor pack_for_producer(const torch::Tensor& dx) {
    packed_rows(dx.device()).copy_(dx);
    return packed_dx_;
  }

  bool need_dw(size_t e) const { return want_dw_[e]; }
  bool need_db(size_t e) { return bias_params[e].defined() && task_should_compute_output(1 + experts() + e); }
  torch::Tensor idle_weight_grad(size_t e) {
    return idle_grad(weight_params[e], {out_features, in_features}, weight_options);
  }
  bool any_dw() const {
    for (size_t e = 0; e < experts(); ++e)
      if (need_dw(e)) return true;
    return false;
  }

  // Bias gradients that are plain sums of dY (bf16 path, and FP8 without the fused cast sums).
  void sum_bias_grads(const torch::Tensor& dy, variable_list& out, bool fp32_sum) {
    const auto begin = row_begins(splits);
    for (size_t e = 0; e < experts(); ++e) {
      if (!need_db(e)) continue;
      const auto& b = bias_params[e];
      if (splits[e] == 0) {
        out[1 + experts() + e] = idle_grad(b, b.sizes(), b.options());
        continue;
      }
      const auto g = dy.narrow(0, begin[e], splits[e]);
      out[1 + experts() + e] = (fp32_sum ? g.sum(0, false, torch::kFloat32) : at::sum_to(g, b.sizes())).to(b.scalar_type());
    }
  }

  void bf16_backward(const torch::Tensor& dy, variable_list& out) {
    if (task_should_compute_output(0)) {
      out[0] = bf16_dgrad(dy, splits, weights, bf16_backend).to(input_dtype);
    }
    weight_grads([dy](GroupedLinearBackward& n, variable_list& o) { n.bf16_wgrads(dy, o); }, out);
    sum_bias_grads(dy, out, false);
  }

  void bf16_wgrads(const torch::Tensor& dy, variable_list& out) {
    const auto begin = row_begins(splits);
    std::vector<GroupedGemm> gemms;
    for (size_t e = 0; e < experts(); ++e) {
      if (!need_dw(e)) continue;
      const auto& param = weight_params[e];
      if (splits[e] == 0) {
        out[1 + e] = idle_grad(param, weights[e].sizes(), weights[e].options());
        continue;
      }
      const torch::Tensor x_e = input_hp.narrow(0, begin[e], splits[e]), dy_e = dy.narrow(0, begin[e], splits[e]);
      const bool lt = dy.is_cuda() && is_bf16(dy) && is_bf16(input_hp);
      const torch::Tensor main_grad = lt ? main_grad_of(param, fusion) : torch::Tensor();
      if (!lt || (!main_grad.defined() && !is_bf16(weights[e]))) {
        out[1 + e] = at::mm(dy_e.t(), x_e).to(weight_dtype);  // addmm's mat2 backward, bit for bit
        continue;
      }
      // Column-major: dW^T [K x N] = X^T [K x m] * dY [m x N] (dY^T stored N x m, transposed).
      GroupedGemm g;
      g.problem.a = GemmOperand{x_e.data_ptr(), DType::kBF16, in_features, splits[e], in_features, false};
      g.problem.b = GemmOperand{dy_e.data_ptr(), DType::kBF16, out_features, splits[e], out_features, true};
      g.config = bucketed(GemmBucket::kK);
      torch::Tensor target = main_grad;
      if (main_grad.defined()) {
        g.config.accumulate = true;  // the optimizer zeroes bf16 experts' main gradients
      } else {
        target = torch::empty({out_features, in_features}, dy.options());
        out[1 + e] = target;
      }
      g.problem.d = GemmOutput{target.data_ptr(), main_grad.defined() ? DType::kFP32 : DType::kBF16, in_features};
      gemms.push_back(g);
    }
    if (!gemms.empty()) {
      GroupedGemmResources& res = grouped_gemm_resources();
      grouped_gemm(res.handle, res.streams, gemms, current_stream(dy.device()));
    }
  }

  void fp8_backward(torch::Tensor dy, variable_list& out) {
    Fp8Engine& e = *sites[0]->engine;
    const Path path = path_of(e);
    const bool need_dx = task_should_compute_output(0), want_dw = any_dw();
    bool want_db = false;
    for (size_t i = 0; i < experts(); ++i) want_db = want_db || need_db(i);
    const bool quantize_dy = need_dx || want_dw;
    // The bias gradients come out of the cast kernel when they can (one read of dY fewer).
    const bool fused_db = want_db && quantize_dy && path == Path::kNative && !e.options().deterministic &&
                          scaling_mode(e.recipe(), TensorRole::kGradOutput) == ScalingMode::kTensor;
    torch::Tensor swiglu_h;  // set: the cast applies SwiGLU's backward to dy, the SwiGLU output's gradient
    if (deferred_swiglu_input.defined()) {
      const int64_t rows = dy.size(0), f = out_features / 2;
      const torch::Tensor dswiglu = dy.view(-1).narrow(0, 0, rows * f).view({rows, f});
      // The cast applies the backward with the transposed copy (the wgrad's), and then gives the
      // bias gradients only as its column sums; quantize_grouped decides whether it fuses it.
      if (want_dw && (!want_db || fused_db)) {
        dy = dswiglu;
        swiglu_h = deferred_swiglu_input;
      } else {
        dy = e.swiglu_backward(dswiglu, deferred_swiglu_input);
      }
    }
    torch::Tensor db;
    if (fused_db) db = torch::zeros({int64_t(experts()), out_features}, dy.options().dtype(torch::kFloat32));
    std::shared_ptr<QuantizedSegments> dyq;
    if (quantize_dy)
      dyq = quantize_grouped(e, sites, TensorRole::kGradOutput, dy, splits, need_dx, want_dw, /*record_amax=*/true,
                             fused_db ? db.data_ptr<float>() : nullptr,
                             swiglu_h.defined() ? Prologue::kSwigluBackward : Prologue::kNone, swiglu_h);
    // Held weight gradients: the dgrad GEMMs now, the wgrad GEMMs later from the same codes.
    const bool split = want_dw && holds_wgrads();
    if (path == Path::kNative && quantize_dy) {
      native_gemms(e, dyq, need_dx, want_dw && !split, out);
      if (split)
        weight_grads([engine = &e, dyq](GroupedLinearBackward& n, variable_list& o) { n.native_gemms(*engine, dyq, false, true, o); },
                     out);
    } else if (quantize_dy) {
      high_precision_gemms(*dyq, need_dx, want_dw && !split, out);
      if (split)
        weight_grads([dyq](GroupedLinearBackward& n, variable_list& o) { n.high_precision_gemms(*dyq, false, true, o); }, out);
    }
    if (need_dx && swiglu_input.defined()) out[0] = e.swiglu_backward(out[0], swiglu_input);
    if (need_dx && swiglu_deferred && !out[0].is_same(packed_dx_)) out[0] = pack_for_producer(out[0]);
    if (fused_db) {
      for (size_t i = 0; i < experts(); ++i)
        if (need_db(i)) out[1 + experts() + i] = db[int64_t(i)].to(bias_params[i].scalar_type());
    } else if (path == Path::kCpu) {
      cpu_bias_grads(dy, out);
    } else {
      sum_bias_grads(dy, out, true);
    }
  }

  // dgrad (need_dx) and wgrad (need_w) of every expert in one grouped launch sequence.
  void native_gemms(Fp8Engine& e, const std::shared_ptr<QuantizedSegments>& dyq, bool need_dx, bool need_w,
                    variable_list& out) {
    std::vector<GroupedGemm> gemms;
    RowOutput dx;
    if (need_dx) {
      dx = row_output(*dyq, in_features, dyq->data.options().dtype(torch::kBFloat16),
                      swiglu_deferred && input_dtype == torch::kBFloat16 ? packed_rows(dyq->data.device()) : torch::Tensor());
      add_row_products(*dyq, [&](size_t i) { return transposed_matrix(weights_q[i]->view); }, {}, false, dx, gemms);
    }
    std::vector<torch::Tensor> wgrads(experts());
    for (size_t i = 0; i < experts() && need_w; ++i) {
      if (!need_dw(i)) continue;
      Fp8Site& site = *sites[i];
      const torch::Tensor main_grad = main_grad_of(weight_params[i], fusion);
      // With the optimizer not zeroing these gradients, the step's first backward overwrites.
      const bool overwrite = main_grad.defined() && e.overwrite_main_grads() &&
                             site.main_grad_generation != e.weight_generation();
      if (main_grad.defined()) site.main_grad_generation = e.weight_generation();
      if (splits[i] == 0) {  // no GEMM: the main gradient of this step starts at zero
        if (overwrite) main_grad.zero_();
        out[1 + i] = main_grad.defined() ? torch::Tensor() : idle_weight_grad(i);
        continue;
      }
      FP8TRON_CHECK(main_grad.defined() || !e.overwrite_main_grads(),
                    site.name + ": the optimizer leaves this weight's gradient to the wgrad GEMM, but it is not an fp32 "
                                "main gradient");
      // dW [N, K] = dY^T [N, m] * (X^T [K, m])^T over the padded tokens (the padding is zeros).
      GroupedGemm g;
      torch::Tensor target = main_grad;
      if (!main_grad.defined()) target = wgrads[i] = torch::empty({out_features, in_features}, dyq->data_t.options().dtype(torch::kBFloat16));
      g.problem = nt_problem(transposed_matrix(dyq->segment(i)), transposed_matrix(input->segment(i)), target.data_ptr(),
                             main_grad.defined() ? DType::kFP32 : DType::kBF16, in_features);
      g.config = bucketed(GemmBucket::kK);
      g.config.accumulate = main_grad.defined() && !overwrite;
      gemms.push_back(g);
    }
    GroupedGemmResources& res = grouped_gemm_resources();
    grouped_gemm(res.handle, res.streams, gemms, current_stream(e.device()));
    if (need_dx) {
      gather_rows(*dyq, dx);
      out[0] = packed_dx_.defined() ? packed_dx_ : dx.out.to(input_dtype);
    }
    for (size_t i = 0; i < experts(); ++i)
      if (wgrads[i].defined()) out[1 + i] = wgrads[i].to(weight_dtype);
  }

  // Emulated / CPU: per expert on the dequantized copies, over the padded rows, as fp8_linear on
  // the expert's padded rows computes them.
  void high_precision_gemms(const QuantizedSegments& dyq, bool need_dx, bool need_w, variable_list& out) {
    const SegmentLayout& l = dyq.layout;
    if (need_dx) out[0] = torch::empty({int64_t(l.total_rows()), in_features}, dyq.dequantized.options().dtype(input_dtype));
    for (size_t i = 0; i < experts(); ++i) {
      const int64_t m = splits[i];
      if (need_dx && m > 0) {
        const auto p = high_precision_product(dyq.dequantized_rows(i), weights_q[i]->dequantized_t, {});
        out[0].narrow(0, int64_t(l.src_begin[i]), m).copy_(p.narrow(0, 0, m));
      }
      if (!need_w || !need_dw(i)) continue;
      out[1 + i] = m > 0 ? high_precision_product(dyq.dequantized_cols(i), input->dequantized_cols(i), {}).to(weight_dtype)
                         : idle_weight_grad(i);
    }
  }

  // CPU: fp8_linear's bias gradient of the expert's padded rows (fp32 sums over the padded dY).
  void cpu_bias_grads(const torch::Tensor& dy, variable_list& out) {
    const auto begin = row_begins(splits);
    const size_t align = fp8_token_alignment(sites[0]->engine->recipe());
    for (size_t i = 0; i < experts(); ++i) {
      if (!need_db(i)) continue;
      const auto& b = bias_params[i];
      if (splits[i] == 0) {
        out[1 + experts() + i] = idle_grad(b, b.sizes(), b.options());
        continue;
      }
      const int64_t m = splits[i], padded = int64_t(padded_rows(size_t(m), align));
      auto g = dy.narrow(0, begin[i], m);
      if (padded != m) g = torch::cat({g, torch::zeros({padded - m, g.size(1)}, g.options())});
      out[1 + experts() + i] = g.sum(0, false, torch::kFloat32).to(b.scalar_type());
    }
  }
};

// Whether fc1's node (`producer`, of fc1's output h) can take over the backward of the SwiGLU fused
// into fc2's cast: h is its only output, FP8 with the same experts' token counts, nothing handed to
// it already, and its gradient cast can fuse the backward (native delayed scaling, bf16, each half
// of h whole 128-column tiles). On the CPU, where CI runs it, the hand-over runs too, with the
// unfused backward in fc1's node.
bool takes_swiglu_hand_over(const GroupedLinearBackward& producer, const torch::Tensor& h, const Splits& splits) {
  if (h.output_nr() != 0 || producer.sites.empty() || producer.deferred_swiglu_input.defined() ||
      producer.splits != splits || producer.out_features != h.size(1) || producer.weight_params.empty())
    return false;
  const Fp8Engine& e = *producer.sites[0]->engine;
  if (path_of(e) == Path::kCpu) return true;
  return h.scalar_type() == torch::kBFloat16 && (producer.out_features / 2) % 128 == 0 &&
         grouped_swiglu_cast_fuses(e, TensorRole::kGradOutput);
}

void check_inputs(const torch::Tensor& x, const Splits& splits, const std::vector<torch::Tensor>& weights,
                  const std::vector<torch::Tensor>& biases, const std::vector<Fp8Site*>& sites, Prologue prologue) {
  const size_t n = weights.size();
  FP8TRON_CHECK(n >= 1 && splits.size() == n && biases.size() == n && (sites.empty() || sites.size() == n),
                "grouped_linear: one token count, weight, bias slot (maybe undefined) and FP8 site (or none) per expert");
  FP8TRON_CHECK(x.dim() == 2, "grouped_linear: the input must be [tokens, in features]");
  const auto shape = weights[0].sizes();
  int64_t total = 0;
  for (size_t e = 0; e < n; ++e) {
    FP8TRON_CHECK(weights[e].dim() == 2 && weights[e].sizes() == shape, "grouped_linear: experts' weights differ in shape");
    FP8TRON_CHECK(!biases[e].defined() || biases[e].sizes() == torch::IntArrayRef{shape[0]}, "grouped_linear: bad bias shape");
    FP8TRON_CHECK(splits[e] >= 0, "grouped_linear: negative token count");
    if (!sites.empty())
      FP8TRON_CHECK(sites[e] && sites[e]->out_features == shape[0] && sites[e]->in_features == shape[1],
                    "grouped_linear: an FP8 site does not match its expert's weight");
    total += splits[e];
  }
  const int64_t in_features = prologue == Prologue::kSwiglu ? 2 * shape[1] : shape[1];
  FP8TRON_CHECK(x.size(1) == in_features && total == x.size(0), "grouped_linear: the input does not match the experts");
}

}  // namespace

torch::Tensor grouped_linear(const torch::Tensor& x_in, const std::vector<int64_t>& splits,
                             const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& biases,
                             const std::vector<Fp8Site*>& sites, Bf16GroupedBackend bf16_backend, Prologue prologue,
                             bool gradient_accumulation_fusion, std::shared_ptr<DeferredWork> wgrad_queue,
                             const torch::Tensor& packed_x) {
  FP8TRON_CHECK(prologue == Prologue::kNone || prologue == Prologue::kSwiglu, "grouped_linear: the only prologue is SwiGLU");
  FP8TRON_CHECK(!packed_x.defined() || (!sites.empty() && prologue == Prologue::kNone &&
                                        quantizes_rows_alone(sites[0]->engine->recipe())),
                "grouped_linear: rows quantized before they travel feed FP8 sites of a per-block recipe, without a prologue");
  check_inputs(x_in, splits, weights, biases, sites, prologue);
  if (sites.empty() && prologue == Prologue::kSwiglu)  // bf16: the SwiGLU as differentiable torch ops
    return grouped_linear(torch_swiglu(x_in), splits, weights, biases, sites, bf16_backend, Prologue::kNone,
                          gradient_accumulation_fusion, std::move(wgrad_queue));
  const size_t n = weights.size();
  const bool grad_mode = torch::GradMode::is_enabled();
  bool need_dw = false, track = grad_mode && x_in.requires_grad();
  for (size_t e = 0; e < n; ++e) {
    need_dw = need_dw || (grad_mode && weights[e].requires_grad());
    track = track || need_dw || (grad_mode && biases[e].defined() && biases[e].requires_grad());
  }
  const torch::Tensor x = x_in.detach().contiguous();
  auto node = std::shared_ptr<GroupedLinearBackward>(new GroupedLinearBackward(), torch::autograd::deleteNode);
  node->fusion = gradient_accumulation_fusion;
  node->wgrad_queue = std::move(wgrad_queue);
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> w, b;
    for (size_t e = 0; e < n; ++e) {
      w.push_back(weights[e].detach());
      b.push_back(biases[e].defined() ? biases[e].detach() : biases[e]);
    }
    if (sites.empty()) {
      y = bf16_forward(x, splits, w, b, bf16_backend);
      node->input_hp = need_dw ? x : torch::Tensor();
      node->weights = w;
    } else {
      // A recomputed forward pass (activation recomputation) records nothing: the original pass did.
      Fp8Forward f = fp8_forward(x, splits, w, b, sites, need_dw, /*record_amax=*/track && !forward_replay_active(), prologue,
                                 packed_x);
      y = f.y;
      // Keep only what backward reads: X's transposed copies (wgrad) and the weights.
      if (need_dw) {
        f.input->data = torch::Tensor();
        f.input->view.data = nullptr;
        f.input->dequantized = torch::Tensor();
        node->input = f.input;
      }
      node->weights_q = std::move(f.weights);
    }
  }
  if (!track) return y;
  node->sites = sites;
  node->splits = splits;
  node->input_dtype = x_in.scalar_type();
  node->weight_dtype = weights[0].scalar_type();
  node->weight_options = weights[0].options();
  node->in_features = weights[0].size(1);
  node->out_features = weights[0].size(0);
  node->bf16_backend = bf16_backend;
  if (prologue == Prologue::kSwiglu && x_in.requires_grad()) {
    // When x comes straight from another FP8 grouped linear (fc1), that node applies SwiGLU's
    // backward inside its own gradient cast (no bf16 gradient of x); otherwise this node applies it.
    auto producer = std::dynamic_pointer_cast<GroupedLinearBackward>(x_in.grad_fn());
    if (producer && takes_swiglu_hand_over(*producer, x_in, splits)) {
      producer->deferred_swiglu_input = x;
      node->swiglu_deferred = true;
    } else {
      node->swiglu_input = x;
    }
  }
  for (size_t e = 0; e < n; ++e) {
    node->weight_params.push_back(weights[e].is_leaf() ? weights[e] : torch::Tensor());
    node->bias_params.push_back(biases[e]);
  }
  std::vector<torch::Tensor> inputs{x_in};
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  inputs.insert(inputs.end(), biases.begin(), biases.end());
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  torch::autograd::set_history(y, node);
  return y;
}

bool grouped_hands_over_swiglu_backward(const torch::Tensor& h) {
  const auto producer = std::dynamic_pointer_cast<GroupedLinearBackward>(h.grad_fn());
  return producer && producer->deferred_swiglu_input.defined();
}

bool grouped_linear_fuses_swiglu(const std::vector<Fp8Site*>& sites) {
  return !sites.empty() && grouped_swiglu_cast_fuses(*sites[0]->engine, TensorRole::kInput);
}

}  // namespace fp8tron::fp8
