#include "parallel/moe_comm.h"

#include <numeric>

#include "core/error.h"
#include "parallel/tensor_parallel.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Autograd contexts hold the group as an opaque pointer (groups outlive every graph) and the
// host counts as int lists.
void save_group(AutogradContext* ctx, Communicator& group) {
  ctx->saved_data["group"] = int64_t(reinterpret_cast<intptr_t>(&group));
}
Communicator& load_group(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(intptr_t(ctx->saved_data["group"].toInt()));
}
std::vector<int64_t> load_counts(AutogradContext* ctx, const char* key) { return ctx->saved_data[key].toIntVector(); }

int64_t row_elements(const torch::Tensor& x) {
  int64_t n = 1;
  for (int64_t d = 1; d < x.dim(); ++d) n *= x.size(d);
  return n;
}
std::vector<int64_t> with_rows(const torch::Tensor& like, int64_t rows) {
  auto sizes = like.sizes().vec();
  sizes[0] = rows;
  return sizes;
}
int64_t total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }
std::vector<int64_t> times(const std::vector<int64_t>& rows, int64_t row) {
  std::vector<int64_t> out;
  for (int64_t r : rows) out.push_back(r * row);
  return out;
}

torch::Tensor exchange(const torch::Tensor& x, Communicator& g, const std::vector<int64_t>& send,
                       const std::vector<int64_t>& recv) {
  auto in = x.contiguous();
  auto out = torch::empty(with_rows(in, total(recv)), in.options());
  g.all_to_all_v(out, in, send, recv);
  return out;
}
torch::Tensor gather_v(const torch::Tensor& x, Communicator& g, const std::vector<int64_t>& rows) {
  auto in = x.contiguous();
  FP8TRON_CHECK(in.size(0) == rows[size_t(g.rank())], "all_gather_rows_v: this rank's rows differ from its count");
  auto out = torch::empty(with_rows(in, total(rows)), in.options());
  auto work = g.all_gather_v_async(out, in, times(rows, row_elements(in)));
  work->wait();
  return out;
}
torch::Tensor scatter_v(const torch::Tensor& x, Communicator& g, const std::vector<int64_t>& rows) {
  auto in = x.contiguous();
  FP8TRON_CHECK(in.size(0) == total(rows), "reduce_scatter_rows_v: the input's rows differ from the counts");
  auto out = torch::empty(with_rows(in, rows[size_t(g.rank())]), in.options());
  auto work = g.reduce_scatter_v_async(out, in, times(rows, row_elements(in)));
  work->wait();
  return out;
}

struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* g, std::vector<int64_t> send,
                               std::vector<int64_t> recv) {
    save_group(ctx, *g);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return exchange(x, *g, send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {exchange(grad[0], load_group(ctx), load_counts(ctx, "recv"), load_counts(ctx, "send")), {}, {}, {}};
  }
};

struct AllGatherRowsV : torch::autograd::Function<AllGatherRowsV> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* g, std::vector<int64_t> rows) {
    save_group(ctx, *g);
    ctx->saved_data["rows"] = rows;
    return gather_v(x, *g, rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {scatter_v(grad[0], load_group(ctx), load_counts(ctx, "rows")), {}, {}};
  }
};

struct ReduceScatterRowsV : torch::autograd::Function<ReduceScatterRowsV> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* g, std::vector<int64_t> rows) {
    save_group(ctx, *g);
    ctx->saved_data["rows"] = rows;
    return scatter_v(x, *g, rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {gather_v(grad[0], load_group(ctx), load_counts(ctx, "rows")), {}, {}};
  }
};

}  // namespace

torch::Tensor all_to_all_rows(const torch::Tensor& x, Communicator& group, const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows, int64_t* bytes_to_peers) {
  if (bytes_to_peers) {
    *bytes_to_peers = 0;
    for (int r = 0; r < group.size() && size_t(r) < send_rows.size(); ++r)
      if (r != group.rank()) *bytes_to_peers += send_rows[size_t(r)] * row_elements(x) * int64_t(x.element_size());
  }
  if (group.size() == 1) return x;
  return AllToAllRows::apply(x, &group, send_rows, recv_rows);
}

torch::Tensor all_gather_rows_v(const torch::Tensor& x, Communicator& group, const std::vector<int64_t>& rows_per_rank) {
  if (group.size() == 1) return x;
  return AllGatherRowsV::apply(x, &group, rows_per_rank);
}

torch::Tensor reduce_scatter_rows_v(const torch::Tensor& x, Communicator& group, const std::vector<int64_t>& rows_per_rank) {
  if (group.size() == 1) return x;
  return ReduceScatterRowsV::apply(x, &group, rows_per_rank);
}

// The sequence-parallel pair is exactly this on dim 0, for any group.
torch::Tensor gather_rows(const torch::Tensor& x, Communicator& group) { return gather_from_sp(x, group); }
torch::Tensor reduce_scatter_rows(const torch::Tensor& x, Communicator& group) { return reduce_scatter_to_sp(x, group); }

torch::Tensor all_gather_no_grad(const torch::Tensor& x, Communicator& group) {
  if (group.size() == 1) return x;
  torch::NoGradGuard no_grad;
  auto in = x.contiguous();
  auto out = torch::empty(with_rows(in, in.size(0) * group.size()), in.options());
  group.all_gather(out, in);
  return out;
}

}  // namespace fp8tron
