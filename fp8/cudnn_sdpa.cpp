#include "fp8/cudnn_sdpa.h"

#include "core/error.h"
#include "core/text.h"

#if FP8TRON_HAVE_CUDNN_FRONTEND
#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>
#endif

namespace fp8tron::fp8 {

#if FP8TRON_HAVE_CUDNN_FRONTEND
namespace {
namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

void check(fe::error_t status, const char* what, const SdpaShape& s) {
  if (status.is_good()) return;
  throw UserError(strprintf("FP8 attention (--fp8-dot-product-attention): cuDNN cannot %s for batch %lld, %lld heads "
                            "(%lld key/value heads), sequence %lld, head dim %lld: %s",
                            what, (long long)s.batch, (long long)s.heads, (long long)s.kv_heads, (long long)s.seq,
                            (long long)s.head_dim, status.get_message().c_str()));
}

fe::DataType_t cudnn_type(Format f) {
  FP8TRON_CHECK(f == Format::kE4M3 || f == Format::kE5M2, "cuDNN FP8 attention takes E4M3 or E5M2");
  return f == Format::kE4M3 ? fe::DataType_t::FP8_E4M3 : fe::DataType_t::FP8_E5M2;
}

// [b, heads, s, d] dimensions of a tensor stored [s, b, heads, d].
std::vector<int64_t> bhsd_dims(const SdpaShape& s, int64_t heads) { return {s.batch, heads, s.seq, s.head_dim}; }
std::vector<int64_t> sbhd_strides(const SdpaShape& s, int64_t heads) {
  return {heads * s.head_dim, s.head_dim, s.batch * heads * s.head_dim, 1};
}

TensorPtr activation(fe::graph::Graph& g, const char* name, const SdpaShape& s, int64_t heads, Format format) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_dim(bhsd_dims(s, heads))
                      .set_stride(sbhd_strides(s, heads))
                      .set_data_type(cudnn_type(format)));
}

TensorPtr scalar(fe::graph::Graph& g, const char* name) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::FLOAT));
}

void mark_scalar_output(const TensorPtr& t) {
  t->set_output(true).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
}

void mark_stats(const TensorPtr& t, const SdpaShape& s) {
  t->set_output(true)
      .set_dim({s.batch, s.heads, s.seq, 1})
      .set_stride({s.heads * s.seq, s.seq, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

cudnnHandle_t handle_for(int device) {
  static std::mutex mutex;
  static std::map<int, cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS)
    throw UserError("FP8 attention: cudnnCreate failed (is cuDNN 9 installed with the torch wheel?)");
  handles[device] = h;
  return h;
}

void finish(fe::graph::Graph& g, cudnnHandle_t h, const SdpaShape& s) {
  check(g.validate(), "validate the graph", s);
  check(g.build_operation_graph(h), "build the operation graph", s);
  check(g.create_execution_plans({fe::HeurMode_t::A}), "find execution plans", s);
  check(g.check_support(h), "support the graph", s);
  check(g.build_plans(h), "build the plans", s);
}

struct ForwardGraph {
  fe::graph::Graph graph;
  TensorPtr q, k, v, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o, o, stats, amax_s, amax_o;
  int64_t workspace = 0;
};

struct BackwardGraph {
  fe::graph::Graph graph;
  TensorPtr q, k, v, o, d_o, stats, descale_q, descale_k, descale_v, descale_o, descale_do, descale_s, descale_dp,
      scale_s, scale_dq, scale_dk, scale_dv, scale_dp, dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp;
  int64_t workspace = 0;
};

std::unique_ptr<ForwardGraph> build_forward(const SdpaShape& s, cudnnHandle_t h) {
  auto f = std::make_unique<ForwardGraph>();
  auto& g = f->graph;
  g.set_io_data_type(fe::DataType_t::FP8_E4M3)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  f->q = activation(g, "Q", s, s.heads, Format::kE4M3);
  f->k = activation(g, "K", s, s.kv_heads, Format::kE4M3);
  f->v = activation(g, "V", s, s.kv_heads, Format::kE4M3);
  f->descale_q = scalar(g, "Descale_Q");
  f->descale_k = scalar(g, "Descale_K");
  f->descale_v = scalar(g, "Descale_V");
  f->descale_s = scalar(g, "Descale_S");
  f->scale_s = scalar(g, "Scale_S");
  f->scale_o = scalar(g, "Scale_O");
  auto options = fe::graph::SDPA_fp8_attributes()
                     .set_name("sdpa_fp8")
                     .set_generate_stats(true)
                     .set_causal_mask(true)
                     .set_attn_scale(s.attn_scale);
  auto [o, stats, amax_s, amax_o] = g.sdpa_fp8(f->q, f->k, f->v, f->descale_q, f->descale_k, f->descale_v,
                                               f->descale_s, f->scale_s, f->scale_o, options);
  o->set_output(true).set_dim(bhsd_dims(s, s.heads)).set_stride(sbhd_strides(s, s.heads)).set_data_type(
      fe::DataType_t::FP8_E4M3);
  mark_stats(stats, s);
  mark_scalar_output(amax_s);
  mark_scalar_output(amax_o);
  f->o = o, f->stats = stats, f->amax_s = amax_s, f->amax_o = amax_o;
  finish(g, h, s);
  check(g.get_workspace_size(f->workspace), "size the workspace", s);
  return f;
}

std::unique_ptr<BackwardGraph> build_backward(const SdpaShape& s, Format grad, cudnnHandle_t h) {
  auto b = std::make_unique<BackwardGraph>();
  auto& g = b->graph;
  g.set_io_data_type(fe::DataType_t::FP8_E4M3)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  b->q = activation(g, "Q", s, s.heads, Format::kE4M3);
  b->k = activation(g, "K", s, s.kv_heads, Format::kE4M3);
  b->v = activation(g, "V", s, s.kv_heads, Format::kE4M3);
  b->o = activation(g, "O", s, s.heads, Format::kE4M3);
  b->d_o = activation(g, "dO", s, s.heads, grad);
  b->stats = g.tensor(fe::graph::Tensor_attributes()
                          .set_name("Stats")
                          .set_dim({s.batch, s.heads, s.seq, 1})
                          .set_stride({s.heads * s.seq, s.seq, 1, 1})
                          .set_data_type(fe::DataType_t::FLOAT));
  b->descale_q = scalar(g, "Descale_Q");
  b->descale_k = scalar(g, "Descale_K");
  b->descale_v = scalar(g, "Descale_V");
  b->descale_o = scalar(g, "Descale_O");
  b->descale_do = scalar(g, "Descale_dO");
  b->descale_s = scalar(g, "Descale_S");
  b->descale_dp = scalar(g, "Descale_dP");
  b->scale_s = scalar(g, "Scale_S");
  b->scale_dq = scalar(g, "Scale_dQ");
  b->scale_dk = scalar(g, "Scale_dK");
  b->scale_dv = scalar(g, "Scale_dV");
  b->scale_dp = scalar(g, "Scale_dP");
  auto options = fe::graph::SDPA_fp8_backward_attributes()
                     .set_name("sdpa_fp8_backward")
                     .set_causal_mask(true)
                     .set_attn_scale(s.attn_scale);
  auto [dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp] =
      g.sdpa_fp8_backward(b->q, b->k, b->v, b->o, b->d_o, b->stats, b->descale_q, b->descale_k, b->descale_v,
                          b->descale_o, b->descale_do, b->descale_s, b->descale_dp, b->scale_s, b->scale_dq,
                          b->scale_dk, b->scale_dv, b->scale_dp, options);
  dq->set_output(true).set_dim(bhsd_dims(s, s.heads)).set_stride(sbhd_strides(s, s.heads)).set_data_type(cudnn_type(grad));
  dk->set_output(true).set_dim(bhsd_dims(s, s.kv_heads)).set_stride(sbhd_strides(s, s.kv_heads)).set_data_type(
      cudnn_type(grad));
  dv->set_output(true).set_dim(bhsd_dims(s, s.kv_heads)).set_stride(sbhd_strides(s, s.kv_heads)).set_data_type(
      cudnn_type(grad));
  for (const auto& a : {amax_dq, amax_dk, amax_dv, amax_dp}) mark_scalar_output(a);
  b->dq = dq, b->dk = dk, b->dv = dv, b->amax_dq = amax_dq, b->amax_dk = amax_dk, b->amax_dv = amax_dv,
  b->amax_dp = amax_dp;
  finish(g, h, s);
  check(g.get_workspace_size(b->workspace), "size the workspace", s);
  return b;
}

using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, float, int>;
Key key_of(const SdpaShape& s, int device, int format) {
  return {device, s.batch, s.heads, s.kv_heads, s.seq, s.head_dim, s.attn_scale, format};
}

// Graphs are built once per shape; the lock also serialises executions on a device's handle.
std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}

ForwardGraph& forward_graph(const SdpaShape& s, int device) {
  static std::map<Key, std::unique_ptr<ForwardGraph>> cache;
  auto& slot = cache[key_of(s, device, -1)];
  if (!slot) slot = build_forward(s, handle_for(device));
  return *slot;
}

BackwardGraph& backward_graph(const SdpaShape& s, Format grad, int device) {
  static std::map<Key, std::unique_ptr<BackwardGraph>> cache;
  auto& slot = cache[key_of(s, device, int(grad))];
  if (!slot) slot = build_backward(s, grad, handle_for(device));
  return *slot;
}

void* mut(const void* p) { return const_cast<void*>(p); }
}  // namespace

bool cudnn_sdpa_built() { return true; }

size_t sdpa_fp8_forward_workspace(const SdpaShape& shape, int device) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  return size_t(forward_graph(shape, device).workspace);
}

size_t sdpa_fp8_backward_workspace(const SdpaShape& shape, Format grad_format, int device) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  return size_t(backward_graph(shape, grad_format, device).workspace);
}

void sdpa_fp8_forward(const SdpaShape& s, const SdpaFp8ForwardArgs& a, void* workspace, int device,
                      CUstream_st* stream) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto& f = forward_graph(s, device);
  std::unordered_map<TensorPtr, void*> pack{
      {f.q, mut(a.q)},
      {f.k, mut(a.k)},
      {f.v, mut(a.v)},
      {f.descale_q, mut(a.descale_q)},
      {f.descale_k, mut(a.descale_k)},
      {f.descale_v, mut(a.descale_v)},
      {f.descale_s, mut(a.descale_s)},
      {f.scale_s, mut(a.scale_s)},
      {f.scale_o, mut(a.scale_o)},
      {f.o, a.o},
      {f.stats, a.stats},
      {f.amax_s, a.amax_s},
      {f.amax_o, a.amax_o}};
  const cudnnHandle_t h = handle_for(device);
  cudnnSetStream(h, stream);
  check(f.graph.execute(h, pack, workspace), "run the forward pass", s);
}

void sdpa_fp8_backward(const SdpaShape& s, Format grad, const SdpaFp8BackwardArgs& a, void* workspace, int device,
                       CUstream_st* stream) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto& b = backward_graph(s, grad, device);
  std::unordered_map<TensorPtr, void*> pack{
      {b.q, mut(a.q)},
      {b.k, mut(a.k)},
      {b.v, mut(a.v)},
      {b.o, mut(a.o)},
      {b.d_o, mut(a.d_o)},
      {b.stats, mut(a.stats)},
      {b.descale_q, mut(a.descale_q)},
      {b.descale_k, mut(a.descale_k)},
      {b.descale_v, mut(a.descale_v)},
      {b.descale_o, mut(a.descale_o)},
      {b.descale_do, mut(a.descale_do)},
      {b.descale_s, mut(a.descale_s)},
      {b.descale_dp, mut(a.descale_dp)},
      {b.scale_s, mut(a.scale_s)},
      {b.scale_dq, mut(a.scale_dq)},
      {b.scale_dk, mut(a.scale_dk)},
      {b.scale_dv, mut(a.scale_dv)},
      {b.scale_dp, mut(a.scale_dp)},
      {b.dq, a.dq},
      {b.dk, a.dk},
      {b.dv, a.dv},
      {b.amax_dq, a.amax_dq},
      {b.amax_dk, a.amax_dk},
      {b.amax_dv, a.amax_dv},
      {b.amax_dp, a.amax_dp}};
  const cudnnHandle_t h = handle_for(device);
  cudnnSetStream(h, stream);
  check(b.graph.execute(h, pack, workspace), "run the backward pass", s);
}

#else  // built without the cuDNN frontend headers

namespace {
[[noreturn]] void unavailable() {
  throw UserError("--fp8-dot-product-attention: this build has no cuDNN frontend (its headers come from "
                  "scripts/setup.sh); run ./scripts/setup.sh and rebuild, or drop the flag");
}
}  // namespace

bool cudnn_sdpa_built() { return false; }
size_t sdpa_fp8_forward_workspace(const SdpaShape&, int) { unavailable(); }
size_t sdpa_fp8_backward_workspace(const SdpaShape&, Format, int) { unavailable(); }
void sdpa_fp8_forward(const SdpaShape&, const SdpaFp8ForwardArgs&, void*, int, CUstream_st*) { unavailable(); }
void sdpa_fp8_backward(const SdpaShape&, Format, const SdpaFp8BackwardArgs&, void*, int, CUstream_st*) {
  unavailable();
}

#endif

}  // namespace fp8tron::fp8
