#include "models/attention/context_parallel_attention.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <limits>

#include "core/error.h"
#include "core/text.h"
#include "models/attention/attention_block.h"

namespace fp8tron {
namespace {

using torch::autograd::variable_list;

constexpr int kKvTag = 11, kGradTag = 12;  // the two messages of a backward ring step

// A block of a causal attention split into pieces: query rows [q_begin, +q_len) against keys
// [k_begin, +k_len) of the key/value tensors it is run with.
struct BlockSpec {
  int64_t q_begin = 0, q_len = 0, k_begin = 0, k_len = 0;
  bool causal = false;
};

// A block as run in forward: what its backward needs.
struct BlockRun {
  BlockSpec spec;
  AttentionBlockOptions options;
  AttentionBlockState state;
};

struct Accumulator {
  torch::Tensor out, lse;  // fp32 [b, h, s, dv], [b, h, s]
  // `dv`: the value head size (multi-latent attention's differs from the query's).
  Accumulator(const torch::Tensor& q, int64_t dv)
      : out(torch::zeros({q.size(0), q.size(1), q.size(2), dv}, q.options().dtype(torch::kFloat32))),
        lse(torch::full({q.size(0), q.size(1), q.size(2)}, -std::numeric_limits<float>::infinity(),
                        q.options().dtype(torch::kFloat32))) {}
};

// A key/value block as one ring message: stacked [2, b, g, s, d] when keys and values have one
// head size, else joined along the head dimension [b, g, s, dk + dv] (multi-latent attention on the
// CPU; on GPUs it pads its values to the key size for the fused kernels). k() and v() are views
// [b, g, s, d] into it, so gradients laid out the same way travel as one message too.
struct KvBlock {
  torch::Tensor packed;
  int64_t dk = 0;
  bool stacked = true;

  static KvBlock pack(const torch::Tensor& k, const torch::Tensor& v) {
    const bool same = k.size(-1) == v.size(-1);
    return {same ? torch::stack({k, v}).contiguous() : torch::cat({k, v}, -1).contiguous(), k.size(-1), same};
  }
  KvBlock like(torch::Tensor other) const { return {std::move(other), dk, stacked}; }
  KvBlock zeros_fp32() const { return like(torch::zeros(packed.sizes(), packed.options().dtype(torch::kFloat32))); }
  torch::Tensor k() const { return stacked ? packed[0] : packed.narrow(-1, 0, dk); }
  torch::Tensor v() const { return stacked ? packed[1] : packed.narrow(-1, dk, packed.size(-1) - dk); }
};

BlockRun run_block(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const BlockSpec& spec,
                   double dropout, double scale, Accumulator& acc) {
  const auto qb = q.narrow(2, spec.q_begin, spec.q_len);
  const auto kb = k.narrow(2, spec.k_begin, spec.k_len), vb = v.narrow(2, spec.k_begin, spec.k_len);
  BlockRun run{spec, {spec.causal, dropout, scale, choose_attention_kernel(qb, kb, dropout, spec.causal)}, {}};
  auto r = attention_block_forward(qb, kb, vb, run.options);
  auto out_rows = acc.out.narrow(2, spec.q_begin, spec.q_len);
  auto lse_rows = acc.lse.narrow(2, spec.q_begin, spec.q_len);
  merge_attention_block(out_rows, lse_rows, r.out, r.lse);
  run.state = std::move(r.state);
  return run;
}

AttentionBlockGrads block_grads(const torch::Tensor& dout, const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& out, const torch::Tensor& lse, const BlockRun& run) {
  const BlockSpec& s = run.spec;
  auto rows = [&](const torch::Tensor& t) { return t.narrow(2, s.q_begin, s.q_len); };
  return attention_block_backward(rows(dout), rows(q), k.narrow(2, s.k_begin, s.k_len), v.narrow(2, s.k_begin, s.k_len),
                                  rows(out), rows(lse), run.state, run.options);
}

// The block of ring step `step` on the local queries (2c rows) and the arriving key/value block (2c).
BlockSpec ring_block(int rank, int size, int step, int64_t c) {
  const RingStep s = ring_step(rank, size, step);
  return BlockSpec{s.all_queries ? 0 : c, s.all_queries ? 2 * c : c, 0, s.first_kv_chunk ? c : 2 * c, s.causal};
}

// Shared by both nodes: the tensors of the forward pass.
struct SavedAttention {
  torch::Tensor q, k, v, out, lse;
  std::vector<BlockRun> runs;
  double dropout = 0, scale = 0;
  // The forward's inputs and output (detached: the node must not own its own output's history).
  void keep(const torch::Tensor& q_, const torch::Tensor& k_, const torch::Tensor& v_, const torch::Tensor& out_,
            double dropout_, double scale_) {
    q = q_.detach();
    k = k_.detach();
    v = v_.detach();
    out = out_.detach();
    dropout = dropout_;
    scale = scale_;
  }
  void release() {
    q = k = v = out = lse = torch::Tensor();
    runs.clear();
  }
};

// Attaches `node` to `out` (a fresh tensor) with q, k, v as its inputs.
torch::Tensor attach(const std::shared_ptr<torch::autograd::Node>& node, const torch::Tensor& out, const torch::Tensor& q,
                     const torch::Tensor& k, const torch::Tensor& v) {
  if (!torch::GradMode::is_enabled() || !(q.requires_grad() || k.requires_grad() || v.requires_grad())) return out;
  node->set_next_edges(torch::autograd::collect_next_edges(q, k, v));
  torch::autograd::set_history(out, node);
  return out;
}

// ---- ring (p2p) -------------------------------------------------------------------------------------
struct RingAttentionBackward : public torch::autograd::Node {
  Communicator* ring = nullptr;
  SavedAttention saved;

  std::string name() const override { return "RingAttentionBackward"; }
  void release_variables() override { saved.release(); }

  variable_list apply(variable_list&& grads) override {
    FP8TRON_CHECK(saved.q.defined(), "RingAttentionBackward ran twice (retain_graph is not supported)");
    const auto& [q, k, v, out, lse, runs, dropout, scale] = saved;
    const int n = ring->size();
    const auto dout = grads[0].contiguous();
    auto dq = torch::zeros(q.sizes(), q.options().dtype(torch::kFloat32));
    KvBlock kv = KvBlock::pack(k, v);
    torch::Tensor dkv_next;  // the key/value gradients of the block at hand, summed by earlier ranks
    std::unique_ptr<CommWork> grad_work;
    for (int step = 0; step < n; ++step) {
      torch::Tensor kv_next;
      std::unique_ptr<CommWork> kv_work;
      if (step + 1 < n) {
        kv_next = torch::empty_like(kv.packed);
        kv_work = ring_exchange(*ring, kv.packed, kv_next, kKvTag);
      }
      const BlockRun& run = runs[size_t(step)];
      const auto g = block_grads(dout, q, kv.k(), kv.v(), out, lse, run);
      dq.narrow(2, run.spec.q_begin, run.spec.q_len).add_(g.dq);
      const KvBlock local = kv.zeros_fp32();
      local.k().narrow(2, run.spec.k_begin, run.spec.k_len).copy_(g.dk);
      local.v().narrow(2, run.spec.k_begin, run.spec.k_len).copy_(g.dv);
      if (grad_work) {
        grad_work->wait();
        local.packed.add_(dkv_next);
      }
      // Forward the sum to the next rank, which holds this block at the next step; after the
      // last step it reaches the block's owner.
      if (n > 1) {
        dkv_next = torch::empty_like(local.packed);
        grad_work = ring_exchange(*ring, local.packed, dkv_next, kGradTag);
      } else {
        dkv_next = local.packed;
      }
      if (kv_work) {
        kv_work->wait();
        kv = kv.like(kv_next);
      }
    }
    if (grad_work) grad_work->wait();
    const KvBlock dkv = kv.like(dkv_next);
    variable_list result = {dq.to(q.scalar_type()), dkv.k().to(k.scalar_type()).contiguous(),
                            dkv.v().to(v.scalar_type()).contiguous()};
    release_variables();
    return result;
  }
};

// ---- all-gathered keys and values -----------------------------------------------------------------
struct BlockAttentionBackward : public torch::autograd::Node {
  SavedAttention saved;

  std::string name() const override { return "ContextParallelBlockAttentionBackward"; }
  void release_variables() override { saved.release(); }

  variable_list apply(variable_list&& grads) override {
    FP8TRON_CHECK(saved.q.defined(), "ContextParallelBlockAttentionBackward ran twice (retain_graph is not supported)");
    const auto& [q, k, v, out, lse, runs, dropout, scale] = saved;
    const auto dout = grads[0].contiguous();
    auto dq = torch::zeros(q.sizes(), q.options().dtype(torch::kFloat32));
    auto dk = torch::zeros(k.sizes(), k.options().dtype(torch::kFloat32));
    auto dv = torch::zeros(v.sizes(), v.options().dtype(torch::kFloat32));
    for (const BlockRun& run : runs) {
      const auto g = block_grads(dout, q, k, v, out, lse, run);
      dq.narrow(2, run.spec.q_begin, run.spec.q_len).add_(g.dq);
      dk.narrow(2, run.spec.k_begin, run.spec.k_len).add_(g.dk);
      dv.narrow(2, run.spec.k_begin, run.spec.k_len).add_(g.dv);
    }
    variable_list result = {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
    release_variables();
    return result;
  }
};

// Local queries (chunks r and 2 CP - 1 - r, c rows each) against the whole sequence's keys in
// order: each chunk sees the chunks before its own fully and its own causally.
torch::Tensor prefix_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int size, int rank,
                               double dropout, double scale) {
  const int64_t c = q.size(2) / 2;
  const auto [first, second] = cp_chunks(size, rank);
  std::vector<BlockSpec> specs;
  for (const auto& [row, chunk] : {std::pair<int64_t, int64_t>{0, first}, {c, second}}) {
    if (chunk > 0) specs.push_back({row, c, 0, chunk * c, false});
    specs.push_back({row, c, chunk * c, c, true});
  }
  auto node = std::shared_ptr<BlockAttentionBackward>(new BlockAttentionBackward(), torch::autograd::deleteNode);
  torch::Tensor out;
  {
    torch::NoGradGuard no_grad;
    Accumulator acc(q, v.size(-1));
    for (const auto& spec : specs) node->saved.runs.push_back(run_block(q, k, v, spec, dropout, scale, acc));
    out = acc.out.to(q.scalar_type());
    node->saved.lse = acc.lse;
  }
  node->saved.keep(q, k, v, out, dropout, scale);
  return attach(node, out, q, k, v);
}

// [s, b, h, d] <-> [b, h, s, d]
torch::Tensor to_bhsd(const torch::Tensor& x) { return x.permute({1, 2, 0, 3}); }
torch::Tensor to_sbhd(const torch::Tensor& x) { return x.permute({2, 0, 1, 3}); }

torch::Tensor ulysses(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, Communicator& a2a,
                      Communicator* ring, double dropout, double scale) {
  const int a = a2a.size();
  const int64_t heads = q.size(2), groups = k.size(2);
  FP8TRON_CHECK(heads % a == 0, strprintf("--cp-comm-type a2a: %lld attention heads per tensor-parallel rank are not "
                                          "divisible by the all-to-all size %d",
                                          (long long)heads, a));
  // Groups that do not split over the all-to-all ranks travel as one copy per query head.
  const bool split_groups = groups % a == 0;
  const auto kx = split_groups ? k : k.repeat_interleave(heads / groups, 2);
  const auto vx = split_groups ? v : v.repeat_interleave(heads / groups, 2);
  const auto qh = cp_sequence_to_heads(q, a2a), kh = cp_sequence_to_heads(kx, a2a), vh = cp_sequence_to_heads(vx, a2a);
  torch::Tensor out;
  if (ring) {
    out = to_sbhd(ring_attention(to_bhsd(qh), to_bhsd(kh), to_bhsd(vh), *ring, dropout, scale));
  } else {
    // The whole sequence, in order: ordinary causal attention on this rank's heads.
    auto kb = to_bhsd(kh), vb = to_bhsd(vh);
    const int64_t per_group = qh.size(2) / kh.size(2);
    if (per_group > 1) {
      kb = kb.repeat_interleave(per_group, 1);
      vb = vb.repeat_interleave(per_group, 1);
    }
    out = to_sbhd(at::scaled_dot_product_attention(to_bhsd(qh), kb, vb, {}, dropout, /*is_causal=*/true, scale));
  }
  return cp_heads_to_sequence(out.contiguous(), a2a);
}

}  // namespace

RingStep ring_step(int rank, int size, int step) {
  if (step == 0) return RingStep{true, false, true};
  const int src = (rank - step + size) % size;
  if (src < rank) return RingStep{true, true, false};
  return RingStep{false, false, false};
}

torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, Communicator& ring,
                             double dropout, double scale) {
  const int n = ring.size(), r = ring.rank();
  FP8TRON_CHECK(q.size(2) % 2 == 0 && k.size(2) == q.size(2), "ring attention: two local chunks of queries and keys");
  const int64_t c = q.size(2) / 2;
  auto node = std::shared_ptr<RingAttentionBackward>(new RingAttentionBackward(), torch::autograd::deleteNode);
  node->ring = &ring;
  torch::Tensor out;
  {
    torch::NoGradGuard no_grad;
    Accumulator acc(q, v.size(-1));
    KvBlock kv = KvBlock::pack(k, v);  // one message per step
    for (int step = 0; step < n; ++step) {
      torch::Tensor kv_next;
      std::unique_ptr<CommWork> work;
      if (step + 1 < n) {  // the next block travels while this one is computed
        kv_next = torch::empty_like(kv.packed);
        work = ring_exchange(ring, kv.packed, kv_next, kKvTag);
      }
      node->saved.runs.push_back(run_block(q, kv.k(), kv.v(), ring_block(r, n, step, c), dropout, scale, acc));
      if (work) {
        work->wait();
        kv = kv.like(kv_next);
      }
    }
    out = acc.out.to(q.scalar_type());
    node->saved.lse = acc.lse;
  }
  node->saved.keep(q, k, v, out, dropout, scale);
  return attach(node, out, q, k, v);
}

torch::Tensor context_parallel_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         const ContextParallelContext& cp, CpCommType type, double dropout, double scale) {
  FP8TRON_CHECK(cp.enabled(), "context_parallel_attention without context parallelism");
  switch (type) {
    case CpCommType::P2P:
      return to_sbhd(ring_attention(to_bhsd(q), to_bhsd(k), to_bhsd(v), *cp.group, dropout, scale));
    case CpCommType::AllGather: {
      const auto kg = cp_gather_sequence(k, *cp.group), vg = cp_gather_sequence(v, *cp.group);
      return to_sbhd(prefix_attention(to_bhsd(q), to_bhsd(kg), to_bhsd(vg), cp.size(), cp.rank(), dropout, scale));
    }
    case CpCommType::A2A:
      return ulysses(q, k, v, *cp.group, nullptr, dropout, scale);
    case CpCommType::A2AP2P:
      FP8TRON_CHECK(cp.a2a_level && cp.p2p_level, "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes");
      return ulysses(q, k, v, *cp.a2a_level, cp.p2p_level.get(), dropout, scale);
  }
  FP8TRON_CHECK(false, "unknown context-parallel communication type");
  return {};
}

}  // namespace fp8tron
