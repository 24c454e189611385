#include "models/moe/permute.h"

#include <ATen/cuda/CUDAContext.h>

#include <numeric>

#include "core/error.h"
#include "models/kernel_stream_of.h"
#include "models/moe/permute_kernels.h"
#include "models/moe/routing.h"

namespace fp8tron::moe {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool kernel_dtype(torch::ScalarType t, kernels::DType* out) {
  switch (t) {
    case torch::kFloat32: *out = kernels::DType::kF32; return true;
    case torch::kBFloat16: *out = kernels::DType::kBF16; return true;
    case torch::kFloat16: *out = kernels::DType::kF16; return true;
    default: return false;
  }
}

// A small host table copied to `device` without draining the stream. CUDA performs a stream
// synchronisation before a copy from pageable host memory, so a plain non_blocking copy stalls the
// host until the GPU's queue is empty (0.8 ms of idle GPU per MoE layer's backward on an H200);
// from pinned memory (torch's caching host allocator, which keeps the block until the copy is
// done) the copy is queued like a kernel.
template <typename T>
torch::Tensor table_on(const torch::Device& device, const std::vector<T>& values, torch::Dtype dtype) {
  auto host = torch::tensor(values, dtype);
  if (!device.is_cuda()) return host;
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

bool is_identity(const std::vector<int64_t>& order) {
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i] != int64_t(i)) return false;
  return true;
}

// out[r] = x[token of row r], times probs[pair of row r] in fp32 when probs is given, in x's dtype.
torch::Tensor gather(const torch::Tensor& x_in, const torch::Tensor& flat_of_row, int64_t experts, const torch::Tensor& probs) {
  auto x = x_in.contiguous();
  const int64_t rows = flat_of_row.size(0), hidden = x.size(1);
  kernels::DType d;
  const bool float_probs = !probs.defined() || probs.scalar_type() != torch::kFloat64;
  if (x.is_cuda() && float_probs && kernel_dtype(x.scalar_type(), &d)) {
    auto out = torch::empty({rows, hidden}, x.options());
    auto p = probs.defined() ? probs.to(torch::kFloat32).contiguous() : torch::Tensor();
    kernels::gather_rows(x.data_ptr(), out.data_ptr(), d, flat_of_row.data_ptr<int64_t>(), experts,
                         p.defined() ? p.data_ptr<float>() : nullptr, rows, hidden, kernel_stream_of(x));
    return out;
  }
  auto out = x.index_select(0, flat_of_row.div(experts, "floor"));
  if (!probs.defined()) return out;
  const auto math = x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto scale = probs.reshape({-1}).index_select(0, flat_of_row);
  return (out.to(math) * scale.to(math).unsqueeze(1)).to(x.scalar_type());
}

// out[t] = sum over t's rows (ascending expert) of probs * y[row], accumulated in fp32.
torch::Tensor combine(const torch::Tensor& y_in, const torch::Tensor& row_of, const torch::Tensor& flat_of_row,
                      const torch::Tensor& probs, torch::Dtype out_dtype) {
  auto y = y_in.contiguous();
  const int64_t tokens = row_of.size(0), experts = row_of.size(1), hidden = y.size(1);
  kernels::DType in, out_d;
  const bool float_probs = !probs.defined() || probs.scalar_type() != torch::kFloat64;
  if (y.is_cuda() && float_probs && kernel_dtype(y.scalar_type(), &in) && kernel_dtype(out_dtype, &out_d)) {
    auto out = torch::empty({tokens, hidden}, y.options().dtype(out_dtype));
    auto p = probs.defined() ? probs.to(torch::kFloat32).contiguous() : torch::Tensor();
    auto map = row_of.contiguous();
    kernels::combine_rows(y.data_ptr(), in, map.data_ptr<int32_t>(), p.defined() ? p.data_ptr<float>() : nullptr,
                          out.data_ptr(), out_d, tokens, experts, hidden, kernel_stream_of(y));
    return out;
  }
  // index_add_ walks the rows in order: a token's experts in ascending order, as the kernel.
  const bool f64 = y.scalar_type() == torch::kFloat64 || (probs.defined() && probs.scalar_type() == torch::kFloat64);
  const auto acc = f64 ? torch::kFloat64 : torch::kFloat32;
  auto rows = y.to(acc);
  if (probs.defined()) rows = rows * probs.reshape({-1}).index_select(0, flat_of_row).to(acc).unsqueeze(1);
  auto out = torch::zeros({tokens, hidden}, y.options().dtype(acc));
  out.index_add_(0, flat_of_row.div(experts, "floor"), rows);
  return out.to(out_dtype);
}

// dprobs[t, e] = <y[row(t, e)], dout[t]> in fp32, [T, E].
torch::Tensor prob_grads(const torch::Tensor& y_in, const torch::Tensor& dout_in, const torch::Tensor& row_of,
                         const torch::Tensor& flat_of_row) {
  const int64_t tokens = row_of.size(0), experts = row_of.size(1);
  kernels::DType d;
  if (y_in.is_cuda() && kernel_dtype(y_in.scalar_type(), &d)) {
    auto y = y_in.contiguous();
    auto dout = dout_in.to(y.scalar_type()).contiguous();
    auto out = torch::empty({tokens, experts}, y.options().dtype(torch::kFloat32));
    auto map = row_of.contiguous();
    kernels::prob_grads(y.data_ptr(), dout.data_ptr(), d, map.data_ptr<int32_t>(), out.data_ptr<float>(), tokens, experts,
                        y.size(1), kernel_stream_of(y));
    return out;
  }
  // The output gradient in y's dtype, as the kernel reads it.
  const auto acc = y_in.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto dout = dout_in.to(y_in.scalar_type()).index_select(0, flat_of_row.div(experts, "floor"));
  auto per_row = (y_in.to(acc) * dout.to(acc)).sum(1);
  auto out = torch::zeros({tokens * experts}, y_in.options().dtype(acc));
  out.index_copy_(0, flat_of_row, per_row);
  return out.view({tokens, experts});
}

struct PermuteFn : torch::autograd::Function<PermuteFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, torch::Tensor row_of, torch::Tensor flat_of_row) {
    ctx->saved_data["row_of"] = row_of;
    ctx->saved_data["flat_of_row"] = flat_of_row;
    return gather(x, flat_of_row, row_of.size(1), {});
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto row_of = ctx->saved_data["row_of"].toTensor();
    auto flat = ctx->saved_data["flat_of_row"].toTensor();
    return {combine(grad[0], row_of, flat, {}, grad[0].scalar_type()), {}, {}};
  }
};

struct UnpermuteFn : torch::autograd::Function<UnpermuteFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& y, const torch::Tensor& probs, torch::Tensor row_of,
                               torch::Tensor flat_of_row, int64_t out_dtype) {
    ctx->save_for_backward({y, probs});
    ctx->saved_data["row_of"] = row_of;
    ctx->saved_data["flat_of_row"] = flat_of_row;
    return combine(y, row_of, flat_of_row, probs, torch::Dtype(out_dtype));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const auto& y = saved[0];
    const auto& probs = saved[1];
    auto row_of = ctx->saved_data["row_of"].toTensor();
    auto flat = ctx->saved_data["flat_of_row"].toTensor();
    const int64_t experts = row_of.size(1);
    auto dout = grad[0];
    auto dy = gather(dout, flat, experts, probs).to(y.scalar_type());
    torch::Tensor dprobs;
    if (probs.requires_grad()) dprobs = prob_grads(y, dout, row_of, flat).to(probs.scalar_type());
    return {dy, dprobs, {}, {}, {}};
  }
};

// unpermute without probabilities: each token sums its rows; backward gives every row its token's
// gradient.
struct CombineFn : torch::autograd::Function<CombineFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& y, torch::Tensor row_of, torch::Tensor flat_of_row,
                               int64_t out_dtype) {
    ctx->saved_data["row_of"] = row_of;
    ctx->saved_data["flat_of_row"] = flat_of_row;
    ctx->saved_data["y_dtype"] = int64_t(y.scalar_type());
    return combine(y, row_of, flat_of_row, {}, torch::Dtype(out_dtype));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto row_of = ctx->saved_data["row_of"].toTensor();
    auto flat = ctx->saved_data["flat_of_row"].toTensor();
    const auto y_dtype = torch::Dtype(ctx->saved_data["y_dtype"].toInt());
    return {gather(grad[0], flat, row_of.size(1), {}).to(y_dtype), {}, {}, {}};
  }
};

struct SortChunksFn : torch::autograd::Function<SortChunksFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, std::vector<int64_t> sizes,
                               std::vector<int64_t> order);
  static variable_list backward(AutogradContext* ctx, variable_list grad);
};

torch::Tensor reorder_chunks(const torch::Tensor& x_in, const std::vector<int64_t>& sizes, const std::vector<int64_t>& order) {
  auto x = x_in.contiguous();
  std::vector<int64_t> start(sizes.size() + 1, 0);
  for (size_t c = 0; c < sizes.size(); ++c) start[c + 1] = start[c] + sizes[c];
  FP8TRON_CHECK(start.back() == x.size(0), "sort_chunks: the chunk sizes do not add up to the rows");
  FP8TRON_CHECK(order.size() == sizes.size(), "sort_chunks: the order must name every chunk once");
  kernels::DType d;
  if (x.is_cuda() && kernel_dtype(x.scalar_type(), &d) && x.dim() == 2) {
    std::vector<int64_t> tables(2 * order.size());
    int64_t at = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      tables[i] = start[size_t(order[i])];
      tables[order.size() + i] = at;
      at += sizes[size_t(order[i])];
    }
    auto device_tables = table_on(x.device(), tables, torch::kInt64);
    auto out = torch::empty_like(x);
    kernels::sort_chunks(x.data_ptr(), out.data_ptr(), d, device_tables.data_ptr<int64_t>(),
                         device_tables.data_ptr<int64_t>() + order.size(), int64_t(order.size()), x.size(0), x.size(1),
                         kernel_stream_of(x));
    return out;
  }
  std::vector<torch::Tensor> pieces;
  for (int64_t c : order) pieces.push_back(x.narrow(0, start[size_t(c)], sizes[size_t(c)]));
  return pieces.empty() ? x : torch::cat(pieces, 0);
}

torch::Tensor SortChunksFn::forward(AutogradContext* ctx, const torch::Tensor& x, std::vector<int64_t> sizes,
                                    std::vector<int64_t> order) {
  ctx->saved_data["sizes"] = sizes;
  ctx->saved_data["order"] = order;
  return reorder_chunks(x, sizes, order);
}

variable_list SortChunksFn::backward(AutogradContext* ctx, variable_list grad) {
  // The output holds chunk order[i] at position i: put every chunk back where it came from.
  const auto sizes = ctx->saved_data["sizes"].toIntVector();
  const auto order = ctx->saved_data["order"].toIntVector();
  std::vector<int64_t> out_sizes(order.size()), inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    out_sizes[i] = sizes[size_t(order[i])];
    inverse[size_t(order[i])] = int64_t(i);
  }
  return {reorder_chunks(grad[0], out_sizes, inverse), {}, {}};
}

}  // namespace

int64_t padded_count(int64_t count, int64_t multiple) {
  return multiple > 0 ? (count + multiple - 1) / multiple * multiple : count;
}

PermuteIndex make_permute_index(const torch::Tensor& map_in, const std::vector<int64_t>& counts, int64_t pad_multiple) {
  FP8TRON_CHECK(map_in.dim() == 2 && int64_t(counts.size()) == map_in.size(1), "permute index: one count per expert");
  torch::NoGradGuard no_grad;
  const int64_t tokens = map_in.size(0), experts = map_in.size(1);
  PermuteIndex index;
  std::vector<int32_t> begin(counts.size(), 0), missing(counts.size(), 0);
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t n = padded_count(counts[e], pad_multiple);
    FP8TRON_CHECK(n <= tokens, "permute index: an expert lacks the unrouted tokens to pad its rows");
    FP8TRON_CHECK(index.rows + n < (int64_t(1) << 31), "permute index: too many rows for int32 row numbers");
    begin[e] = int32_t(index.rows);
    missing[e] = int32_t(n - counts[e]);
    index.counts.push_back(n);
    index.rows += n;
  }
  auto map = map_in.scalar_type() == torch::kBool ? map_in : map_in.to(torch::kBool);
  // The kernel takes its per-expert table as a kernel argument: up to kMaxIndexExperts columns
  // (more take the torch operations below).
  if (map.is_cuda() && map.stride(1) == 1 && experts <= kernels::kMaxIndexExperts) {
    index.row_of = torch::empty({tokens, experts}, map.options().dtype(torch::kInt32));
    index.flat_of_row = torch::empty({index.rows}, map.options().dtype(torch::kInt64));
    kernels::permute_index(map.data_ptr<bool>(), map.stride(0), tokens, experts, begin.data(), missing.data(),
                           index.row_of.data_ptr<int32_t>(), index.flat_of_row.data_ptr<int64_t>(), kernel_stream_of(map));
    return index;
  }
  // The same index from torch operations (the CPU path, which the GPU tests hold the kernel to).
  if (pad_multiple > 0) map = pad_routing_map(map, pad_multiple);
  // Rank of each token among the expert's rows, plus the expert's first row. The running count
  // runs down each column; on a GPU (maps of more than kMaxIndexExperts columns) torch scans the
  // outer dimension with a thread per column, so the rows of the transpose are scanned instead.
  const auto int32 = map.options().dtype(torch::kInt32);
  auto rank = map.to(torch::kInt32).t().contiguous().cumsum(1, torch::kInt32).t() - 1;
  auto first = table_on(map.device(), begin, torch::kInt32);
  index.row_of = torch::where(map, rank + first.unsqueeze(0), torch::full({}, -1, int32)).to(torch::kInt32).contiguous();
  // Invert: row -> t * E + e (the unrouted pairs all land in a spare slot, dropped).
  auto rows = index.row_of.reshape({-1}).to(torch::kInt64);
  auto target = torch::where(rows >= 0, rows, torch::full({}, index.rows, rows.options()));
  auto inverse = torch::empty({index.rows + 1}, rows.options()).scatter_(0, target, torch::arange(map.numel(), rows.options()));
  index.flat_of_row = inverse.narrow(0, 0, index.rows);
  return index;
}

torch::Tensor permute(const torch::Tensor& x, const PermuteIndex& index) {
  FP8TRON_CHECK(x.dim() == 2 && x.size(0) == index.tokens(), "permute: x must be [tokens, hidden]");
  return PermuteFn::apply(x, index.row_of, index.flat_of_row);
}

torch::Tensor unpermute(const torch::Tensor& y, const PermuteIndex& index, const torch::Tensor& probs, torch::Dtype out_dtype) {
  FP8TRON_CHECK(y.dim() == 2 && y.size(0) == index.rows, "unpermute: y must hold the permuted rows");
  FP8TRON_CHECK(!probs.defined() || (probs.dim() == 2 && probs.size(0) == index.tokens() && probs.size(1) == index.experts()),
                "unpermute: probs must be [tokens, experts]");
  if (!probs.defined()) return CombineFn::apply(y, index.row_of, index.flat_of_row, int64_t(out_dtype));
  return UnpermuteFn::apply(y, probs, index.row_of, index.flat_of_row, int64_t(out_dtype));
}

torch::Tensor sort_chunks(const torch::Tensor& x, const std::vector<int64_t>& sizes, const std::vector<int64_t>& order) {
  // One source (expert parallelism and expert TP of 1): the chunks are already by local expert.
  if (is_identity(order)) {
    FP8TRON_CHECK(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) == x.size(0),
                  "sort_chunks: the chunk sizes do not add up to the rows");
    return x;
  }
  return SortChunksFn::apply(x, sizes, order);
}

std::vector<int64_t> sort_chunks_source_rows(const std::vector<int64_t>& sizes, const std::vector<int64_t>& order) {
  std::vector<int64_t> start(sizes.size() + 1, 0);
  for (size_t c = 0; c < sizes.size(); ++c) start[c + 1] = start[c] + sizes[c];
  std::vector<int64_t> rows;
  for (int64_t c : order)
    for (int64_t r = 0; r < sizes[size_t(c)]; ++r) rows.push_back(start[size_t(c)] + r);
  return rows;
}

}  // namespace fp8tron::moe
