#include "models/attention/attention_block.h"

#include <ATen/SDPBackend.h>

#include <limits>

#include "core/error.h"

namespace fp8tron {
namespace {

// Grouped keys/values as one head per query head (the kernels and the math path want equal head
// counts), and the gradients of those copies summed back onto their group.
torch::Tensor expand_groups(const torch::Tensor& kv, int64_t heads) {
  const int64_t groups = kv.size(1);
  return groups == heads ? kv : kv.repeat_interleave(heads / groups, 1);
}
torch::Tensor sum_groups(const torch::Tensor& grad, int64_t groups) {
  const int64_t heads = grad.size(1);
  if (groups == heads) return grad;
  return grad.view({grad.size(0), groups, heads / groups, grad.size(2), grad.size(3)}).sum(2);
}

// fp32 scores of a block, masked above the diagonal for a causal one.
torch::Tensor scores(const torch::Tensor& q, const torch::Tensor& k, const AttentionBlockOptions& o) {
  auto s = torch::matmul(q.to(torch::kFloat32), k.to(torch::kFloat32).transpose(-2, -1)).mul_(o.scale);
  if (o.causal) {
    const int64_t sq = s.size(-2), sk = s.size(-1);
    auto above = torch::ones({sq, sk}, s.options().dtype(torch::kBool)).triu(1);
    s.masked_fill_(above, -std::numeric_limits<float>::infinity());
  }
  return s;
}

AttentionBlockResult math_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const AttentionBlockOptions& o) {
  AttentionBlockResult r;
  auto s = scores(q, k, o);
  r.lse = s.logsumexp(-1);
  auto p = (s - r.lse.unsqueeze(-1)).exp_();
  if (o.dropout > 0) {
    r.state.dropout_mask = torch::bernoulli(torch::full_like(p, 1.0 - o.dropout)).to(torch::kBool);
    p = p * r.state.dropout_mask / (1.0 - o.dropout);
  }
  r.out = torch::matmul(p, v.to(torch::kFloat32)).to(q.scalar_type());
  return r;
}

AttentionBlockGrads math_backward(const torch::Tensor& dout, const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const torch::Tensor& out, const torch::Tensor& lse,
                                  const AttentionBlockState& st, const AttentionBlockOptions& o) {
  const auto dof = dout.to(torch::kFloat32), qf = q.to(torch::kFloat32), kf = k.to(torch::kFloat32), vf = v.to(torch::kFloat32);
  auto p = (scores(q, k, o) - lse.unsqueeze(-1)).exp_();  // this block's share of the row's softmax
  auto dp = torch::matmul(dof, vf.transpose(-2, -1));
  torch::Tensor kept = p;
  if (o.dropout > 0) {
    const double keep = 1.0 - o.dropout;
    kept = p * st.dropout_mask / keep;
    dp = dp * st.dropout_mask / keep;
  }
  // dS = P (dP - D) with D = rowsum(dO . O) over the whole row (the merged output).
  const auto D = (dof * out.to(torch::kFloat32)).sum(-1, /*keepdim=*/true);
  const auto ds = p * (dp - D);
  AttentionBlockGrads g;
  g.dv = torch::matmul(kept.transpose(-2, -1), dof);
  g.dq = torch::matmul(ds, kf).mul_(o.scale);
  g.dk = torch::matmul(ds.transpose(-2, -1), qf).mul_(o.scale);
  return g;
}

// Gives `t` the strides `strides` (the layout a kernel produced its output in and expects back).
torch::Tensor with_strides(const torch::Tensor& t, const std::vector<int64_t>& strides) {
  if (strides.empty() || t.strides().vec() == strides) return t;
  auto r = at::empty_strided(t.sizes(), strides, t.options());
  r.copy_(t);
  return r;
}

AttentionBlockResult kernel_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    const AttentionBlockOptions& o) {
  AttentionBlockResult r;
  AttentionBlockState& st = r.state;
  torch::Tensor lse;
  switch (o.kernel) {
    case AttentionKernel::Flash: {
      auto res = at::_scaled_dot_product_flash_attention(q, k, v, o.dropout, o.causal, false, o.scale);
      r.out = std::get<0>(res);
      lse = std::get<1>(res);
      st.cum_seq_q = std::get<2>(res);
      st.cum_seq_k = std::get<3>(res);
      st.max_q = std::get<4>(res).expect_int();
      st.max_k = std::get<5>(res).expect_int();
      st.philox_seed = std::get<6>(res);
      st.philox_offset = std::get<7>(res);
      break;
    }
    case AttentionKernel::Efficient: {
      auto res = at::_scaled_dot_product_efficient_attention(q, k, v, {}, /*compute_log_sumexp=*/true, o.dropout, o.causal,
                                                             o.scale);
      r.out = std::get<0>(res);
      lse = std::get<1>(res);
      st.philox_seed = std::get<2>(res);
      st.philox_offset = std::get<3>(res);
      break;
    }
    case AttentionKernel::Cudnn: {
      auto res = at::_scaled_dot_product_cudnn_attention(q, k, v, {}, /*compute_log_sumexp=*/true, o.dropout, o.causal,
                                                         false, o.scale);
      r.out = std::get<0>(res);
      lse = std::get<1>(res);
      st.cum_seq_q = std::get<2>(res);
      st.cum_seq_k = std::get<3>(res);
      st.max_q = std::get<4>(res).expect_int();
      st.max_k = std::get<5>(res).expect_int();
      st.philox_seed = std::get<6>(res);
      st.philox_offset = std::get<7>(res);
      break;
    }
    case AttentionKernel::Math: FP8TRON_CHECK(false, "kernel_forward: not a fused kernel");
  }
  // The kernels' LSE layouts differ ([b, h, sq], [b, h, sq, 1], padded to 32 rows): keep the
  // layout for backward, merge as [b, h, sq].
  st.lse_shape = lse.sizes().vec();
  st.out_strides = r.out.strides().vec();
  const int64_t sq = q.size(2);
  r.lse = lse.dim() == 4 ? lse.squeeze(-1) : lse;
  if (r.lse.size(2) != sq) r.lse = r.lse.narrow(2, 0, sq);
  r.lse = r.lse.to(torch::kFloat32).contiguous();
  return r;
}

// The merged LSE of a block's rows in the layout its kernel wants back.
torch::Tensor kernel_lse(const torch::Tensor& lse, const AttentionBlockState& st) {
  if (st.lse_shape.size() == 4) return lse.unsqueeze(-1).contiguous();
  if (st.lse_shape[2] == lse.size(2)) return lse.contiguous();
  auto padded = torch::zeros(st.lse_shape, lse.options());
  padded.narrow(2, 0, lse.size(2)).copy_(lse);
  return padded;
}

AttentionBlockGrads kernel_backward(const torch::Tensor& dout_in, const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const torch::Tensor& out_in, const torch::Tensor& lse_in,
                                    const AttentionBlockState& st, const AttentionBlockOptions& o) {
  const auto out = with_strides(out_in.to(q.scalar_type()), st.out_strides);
  const auto dout = with_strides(dout_in.to(q.scalar_type()), st.out_strides);
  const auto lse = kernel_lse(lse_in, st);
  AttentionBlockGrads g;
  switch (o.kernel) {
    case AttentionKernel::Flash: {
      auto res = at::_scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse, st.cum_seq_q, st.cum_seq_k, st.max_q,
                                                                  st.max_k, o.dropout, o.causal, st.philox_seed,
                                                                  st.philox_offset, o.scale);
      g = {std::get<0>(res), std::get<1>(res), std::get<2>(res)};
      break;
    }
    case AttentionKernel::Efficient: {
      auto res = at::_scaled_dot_product_efficient_attention_backward(dout, q, k, v, torch::Tensor(), out, lse, st.philox_seed,
                                                                      st.philox_offset, o.dropout, {true, true, true, false},
                                                                      o.causal, o.scale);
      g = {std::get<0>(res), std::get<1>(res), std::get<2>(res)};
      break;
    }
    case AttentionKernel::Cudnn: {
      auto res = at::_scaled_dot_product_cudnn_attention_backward(dout, q, k, v, out, lse, st.philox_seed, st.philox_offset,
                                                                  torch::Tensor(), st.cum_seq_q, st.cum_seq_k, st.max_q,
                                                                  st.max_k, o.dropout, o.causal, o.scale);
      g = {std::get<0>(res), std::get<1>(res), std::get<2>(res)};
      break;
    }
    case AttentionKernel::Math: FP8TRON_CHECK(false, "kernel_backward: not a fused kernel");
  }
  return g;
}

}  // namespace

const char* attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::Math: return "math";
    case AttentionKernel::Flash: return "flash";
    case AttentionKernel::Efficient: return "memory-efficient";
    case AttentionKernel::Cudnn: return "cuDNN";
  }
  return "?";
}

AttentionBlockResult attention_block_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                             const AttentionBlockOptions& o) {
  FP8TRON_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(1) % k.size(1) == 0,
                "attention block: q [b, h, sq, d] and k, v [b, hk, sk, d] with h a multiple of hk");
  FP8TRON_CHECK(!o.causal || q.size(2) == k.size(2), "attention block: a causal block is square");
  const auto ke = expand_groups(k, q.size(1)), ve = expand_groups(v, q.size(1));
  return o.kernel == AttentionKernel::Math ? math_forward(q, ke, ve, o) : kernel_forward(q, ke, ve, o);
}

AttentionBlockGrads attention_block_backward(const torch::Tensor& dout, const torch::Tensor& q, const torch::Tensor& k,
                                             const torch::Tensor& v, const torch::Tensor& out, const torch::Tensor& lse,
                                             const AttentionBlockState& state, const AttentionBlockOptions& o) {
  const auto ke = expand_groups(k, q.size(1)), ve = expand_groups(v, q.size(1));
  AttentionBlockGrads g = o.kernel == AttentionKernel::Math ? math_backward(dout, q, ke, ve, out, lse, state, o)
                                                            : kernel_backward(dout, q, ke, ve, out, lse, state, o);
  g.dq = g.dq.to(q.scalar_type());
  g.dk = sum_groups(g.dk.to(torch::kFloat32), k.size(1)).to(k.scalar_type());
  g.dv = sum_groups(g.dv.to(torch::kFloat32), v.size(1)).to(v.scalar_type());
  return g;
}

void merge_attention_block(torch::Tensor& out_acc, torch::Tensor& lse_acc, const torch::Tensor& out, const torch::Tensor& lse) {
  const auto merged = torch::logaddexp(lse_acc, lse);
  const auto keep = (lse_acc - merged).exp_().unsqueeze(-1);
  const auto add = (lse - merged).exp_().unsqueeze(-1);
  out_acc.mul_(keep).add_(out.to(torch::kFloat32) * add);
  lse_acc.copy_(merged);
}

AttentionKernel choose_attention_kernel(const torch::Tensor& q, const torch::Tensor& k, double dropout, bool causal) {
  if (!q.is_cuda()) return AttentionKernel::Math;
  // Keys with one head per query head, as the kernels get them (uninitialised: only the shape,
  // dtype, layout and whether gradients are wanted decide).
  auto ke = k.size(1) == q.size(1) ? k : torch::empty({k.size(0), q.size(1), k.size(2), k.size(3)}, k.options());
  if (!ke.is_same(k)) ke.requires_grad_(k.requires_grad());
  switch (at::SDPBackend(at::_fused_sdp_choice(q, ke, ke, {}, dropout, causal))) {
    case at::SDPBackend::cudnn_attention: return AttentionKernel::Cudnn;
    case at::SDPBackend::flash_attention: return AttentionKernel::Flash;
    case at::SDPBackend::efficient_attention: return AttentionKernel::Efficient;
    default: return AttentionKernel::Math;
  }
}

}  // namespace fp8tron
