#include "trainer/export/hf_layout.h"

namespace fp8tron::hf {

Qkv split_qkv(const torch::Tensor& qkv, const QkvShape& s) {
  const int64_t per_group = s.heads / s.groups;
  auto grouped = qkv.reshape({s.groups, per_group + 2, s.head_dim, -1});
  auto rows = [&](const torch::Tensor& t) { return qkv.dim() == 1 ? t.reshape({-1}) : t.reshape({-1, qkv.size(1)}); };
  return {rows(grouped.narrow(1, 0, per_group)), rows(grouped.select(1, per_group)), rows(grouped.select(1, per_group + 1))};
}

torch::Tensor fuse_qkv(const Qkv& qkv, const QkvShape& s) {
  const int64_t per_group = s.heads / s.groups;
  const bool bias = qkv.q.dim() == 1;
  const int64_t in = bias ? 1 : qkv.q.size(1);
  auto q = qkv.q.reshape({s.groups, per_group, s.head_dim, in});
  auto k = qkv.k.reshape({s.groups, 1, s.head_dim, in});
  auto v = qkv.v.reshape({s.groups, 1, s.head_dim, in});
  auto fused = torch::cat({q, k, v}, 1);
  return bias ? fused.reshape({-1}) : fused.reshape({-1, in});
}

torch::Tensor deinterleave_heads(const torch::Tensor& w, int64_t head_dim) {
  auto heads = w.reshape({-1, head_dim / 2, 2, w.size(-1)});
  return torch::cat({heads.select(2, 0), heads.select(2, 1)}, 1).reshape(w.sizes());
}

torch::Tensor interleave_heads(const torch::Tensor& w, int64_t head_dim) {
  // Rows [first half; second half] of each head back to pairs (first[i], second[i]).
  auto heads = w.reshape({-1, 2, head_dim / 2, w.size(-1)});
  return torch::stack({heads.select(1, 0), heads.select(1, 1)}, 2).reshape(w.sizes());
}

}  // namespace fp8tron::hf
