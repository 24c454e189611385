#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <optional>

#include "core/error.h"

namespace fp8tron {

std::vector<PipelineStep> pipeline_order(int pp, int rank, int chunks, int64_t num_micro, int64_t group,
                                         bool extra_warmup_forward) {
  const int64_t total = num_micro * chunks;
  if (group <= 0) group = pp;
  // Megatron's schedule table (get_schedule_table): micro-batches in groups of `group`, the last
  // group taking the remainder; within a group every micro-batch runs on chunk 0, then chunk 1, ...
  // The k-th forward of a rank is table[k]; the k-th backward is table[k] with the chunks reversed.
  std::vector<std::pair<int64_t, int>> table;  // (micro-batch, chunk)
  for (int64_t lo = 0; lo < num_micro; lo += group) {
    const int64_t hi = lo + group >= num_micro ? num_micro : lo + group;
    for (int c = 0; c < chunks; ++c)
      for (int64_t mb = lo; mb < hi; ++mb) table.emplace_back(mb, c);
    if (hi == num_micro) break;
  }
  int64_t warmup;
  if (chunks == 1) warmup = std::min<int64_t>(pp - rank - 1, num_micro);
  else warmup = std::min<int64_t>(int64_t(pp - rank - 1) * 2 + int64_t(chunks - 1) * group, total);
  if (extra_warmup_forward) warmup = std::min<int64_t>(warmup + 1, total);

  std::vector<PipelineStep> order;
  int64_t f = 0, b = 0;
  auto fwd = [&] { order.push_back({true, table[size_t(f)].second, table[size_t(f)].first}); ++f; };
  auto bwd = [&] { order.push_back({false, chunks - 1 - table[size_t(b)].second, table[size_t(b)].first}); ++b; };
  for (int64_t i = 0; i < warmup; ++i) fwd();
  while (f < total) {  // steady state: one forward, one backward
    fwd();
    order.back().steady = true;
    bwd();
  }
  while (b < total) bwd();             // cooldown
  return order;
}

bool prefetches_next_receive(const std::vector<PipelineStep>& order, size_t i, const PipelineOverlap& overlap) {
  if (!overlap.p2p || i + 1 >= order.size()) return false;
  if (overlap.warmup_flush) return true;
  // Steady state: from the last warmup forward to the backward paired with the last forward.
  size_t first_backward = order.size(), last_forward = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    if (!order[k].forward && first_backward == order.size()) first_backward = k;
    if (order[k].forward) last_forward = k;
  }
  const size_t steady_begin = first_backward == 0 ? 0 : first_backward - 1;
  return i + 1 >= steady_begin && i + 1 <= last_forward + 1;
}

namespace {

// NCCL connects two ranks of a communicator at their first send/receive, and the connection holds
// the CPU until the peer makes its first call there too. The overlapped schedules post a step's
// receive before the previous step's compute: if that receive is the first message from its peer,
// the rank waits on the CPU, before its own send, for a peer that may itself be held on the CPU
// (a synchronising operation) until that send arrives. Seen on one GPU over NCCL: PP2 interleaved
// with --overlap-p2p-communication-warmup-flush, stage 0 stuck before its second send. So every
// pair exchanges one message when the schedule is built, in the same order on every rank (by
// direction, then sending stage): each connection's two ends then meet without waiting on others.
void connect_pipeline_neighbours(const ParallelState& parallel, const torch::TensorOptions& options) {
  const int pp = parallel.sizes.pp, rank = parallel.pp_rank;
  if (pp == 1) return;
  for (const bool forward : {true, false}) {
    const auto& senders = forward ? parallel.forward_senders : parallel.backward_senders;
    for (int sender = 0; sender < pp; ++sender) {
      const int receiver = forward ? (sender + 1) % pp : (sender - 1 + pp) % pp;
      auto token = torch::zeros({1}, options);
      if (rank == sender) senders[size_t(sender)]->batch_p2p_async({{true, token, receiver, 0}})->wait();
      else if (rank == receiver) senders[size_t(sender)]->batch_p2p_async({{false, token, sender, 0}})->wait();
    }
  }
}

}  // namespace

PipelineSchedule::PipelineSchedule(const ParallelState& parallel, int chunks, std::vector<int64_t> shape, torch::Dtype dtype,
                                   torch::Device device, PipelineOverlap overlap, CombinedSteps combined)
    : parallel_(parallel),
      chunks_(chunks),
      overlap_(overlap),
      combined_(std::move(combined)),
      shape_(std::move(shape)),
      options_(torch::TensorOptions().dtype(dtype).device(device)) {
  connect_pipeline_neighbours(parallel_, options_);
}

torch::Tensor PipelineSchedule::run(int64_t num_micro, const ForwardFn& forward, double loss_scale,
                                    const std::function<void()>& before_last_backward, int64_t group) {
  const int pp = parallel_.sizes.pp, rank = parallel_.pp_rank;
  const int virtual_stages = pp * chunks_;
  const int64_t n = group > 0 ? group : pp;
  if (chunks_ > 1 && (n < pp || n > num_micro || (num_micro % n != 0 && num_micro % n < pp)))
    throw std::runtime_error("the interleaved schedule's micro-batch groups do not fit the number of micro-batches");
  auto stage_of = [&](int chunk) { return chunk * pp + rank; };
  // A message's tag names its receiving virtual stage, direction and micro-batch.
  auto tag = [&](bool forward, int receiver_stage, int64_t micro) {
    return int(((forward ? 0 : 1) * int64_t(virtual_stages) + receiver_stage) * num_micro + micro);
  };
  std::vector<std::unique_ptr<CommWork>> pending_sends;
  auto senders = [&](bool forward) -> const std::vector<std::shared_ptr<Communicator>>& {
    return forward ? parallel_.forward_senders : parallel_.backward_senders;
  };
  auto send = [&](bool forward, const torch::Tensor& t, int peer, int message_tag) {
    auto data = t.detach().contiguous();
    pending_sends.push_back(senders(forward)[size_t(rank)]->batch_p2p_async({{true, data, peer, message_tag}}));
  };
  const int prev = (rank - 1 + pp) % pp, next = (rank + 1) % pp;
  // The receive a step needs, if any: activations from the previous stage, gradients from the next.
  struct Receive {
    torch::Tensor tensor;
    std::unique_ptr<CommWork> work;
    Communicator* comm = nullptr;
  };
  auto post_receive = [&](const PipelineStep& step) -> std::optional<Receive> {
    const int stage = stage_of(step.chunk);
    if (step.forward ? stage == 0 : stage == virtual_stages - 1) return std::nullopt;
    const int peer = step.forward ? prev : next;
    Receive r;
    r.tensor = torch::empty(shape_, options_);
    r.comm = senders(step.forward)[size_t(peer)].get();
    r.work = r.comm->batch_p2p_async({{false, r.tensor, peer, tag(step.forward, stage, step.micro_batch)}});
    return r;
  };
  auto received = [&](std::optional<Receive>& r) {
    r->comm->wait(*r->work);
    return r->tensor;
  };

  using InOut = std::pair<torch::Tensor, torch::Tensor>;  // a step's input and output
  std::map<std::pair<int, int64_t>, InOut> in_flight;      // (chunk, micro) -> forward done
  auto loss_sum = torch::zeros({}, options_.dtype(torch::kFloat32));
  const bool combined = combined_.turns != nullptr;
  const auto order = pipeline_order(pp, rank, chunks_, num_micro, n, combined);
  // The steps that run together from step i: a steady-state forward and the backward after it
  // when combined, else step i alone.
  auto unit_end = [&](size_t i) { return i + (combined && order[i].steady ? 2 : 1); };
  std::map<size_t, std::optional<Receive>> posted;  // receives posted ahead of their step
  auto message_for = [&](size_t i) {
    std::optional<Receive> incoming;
    if (auto it = posted.find(i); it != posted.end()) {
      incoming = std::move(it->second);
      posted.erase(it);
    } else {
      incoming = post_receive(order[i]);
    }
    return incoming ? received(incoming) : torch::Tensor();
  };
  auto run_forward = [&](const PipelineStep& step, const torch::Tensor& message) -> InOut {
    torch::Tensor input;
    if (stage_of(step.chunk) != 0) input = message.requires_grad_(true);
    return {input, forward(step.chunk, step.micro_batch, input)};
  };
  auto finish_forward = [&](const PipelineStep& step, InOut io) {
    const int stage = stage_of(step.chunk);
    if (stage == virtual_stages - 1) loss_sum += io.second.detach().to(torch::kFloat32);
    else send(true, io.second, next, tag(true, stage + 1, step.micro_batch));
    in_flight[{step.chunk, step.micro_batch}] = std::move(io);
  };
  auto take_forward = [&](const PipelineStep& step) {
    auto node = in_flight.extract({step.chunk, step.micro_batch});
    FP8TRON_CHECK(!node.empty(), "backward before forward in the pipeline schedule");
    return node.mapped();
  };
  auto run_backward = [&](const PipelineStep& step, const InOut& io, const torch::Tensor& message) {
    if (stage_of(step.chunk) == virtual_stages - 1) (io.second * loss_scale).backward();
    else torch::autograd::backward({io.second}, {message});
    if (combined_.after_backward) combined_.after_backward();
  };
  auto finish_backward = [&](const PipelineStep& step, const InOut& io) {
    const int stage = stage_of(step.chunk);
    if (stage != 0) send(false, io.first.grad(), prev, tag(false, stage - 1, step.micro_batch));
  };

  for (size_t i = 0; i < order.size();) {
    const size_t end = unit_end(i);
    if (end == order.size() && before_last_backward) before_last_backward();
    std::vector<torch::Tensor> messages;
    for (size_t k = i; k < end; ++k) messages.push_back(message_for(k));
    // Megatron's overlap_p2p_comm: the next steps' receives go out before this compute.
    if (prefetches_next_receive(order, end - 1, overlap_))
      for (size_t k = end; k < unit_end(end); ++k) posted[k] = post_receive(order[k]);
    if (end - i == 2) {  // a forward and a backward taking turns at the all-to-alls
      const PipelineStep &f = order[i], &b = order[i + 1];
      const InOut backward_io = take_forward(b);
      InOut forward_io;
      combined_.turns->run_pair([&] { run_backward(b, backward_io, messages[1]); },
                                [&] { forward_io = run_forward(f, messages[0]); }, combined_.device);
      finish_forward(f, std::move(forward_io));
      finish_backward(b, backward_io);
    } else if (order[i].forward) {
      finish_forward(order[i], run_forward(order[i], messages[0]));
    } else {
      const InOut io = take_forward(order[i]);
      run_backward(order[i], io, messages[0]);
      finish_backward(order[i], io);
    }
    i = end;
  }
  for (auto& w : pending_sends) w->wait();
  return loss_sum;
}

torch::Tensor PipelineSchedule::run_forward_only(int64_t num_micro, const ForwardFn& forward, int64_t micro_batch_size) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> shape = shape_;  // [s, b, h]
  if (micro_batch_size > 0) shape[1] = micro_batch_size;
  const int pp = parallel_.sizes.pp, rank = parallel_.pp_rank, virtual_stages = pp * chunks_;
  std::vector<std::unique_ptr<CommWork>> pending_sends;
  auto loss_sum = torch::zeros({}, options_.dtype(torch::kFloat32));
  const int prev = (rank - 1 + pp) % pp, next = (rank + 1) % pp;
  for (int64_t mb = 0; mb < num_micro; ++mb)
    for (int chunk = 0; chunk < chunks_; ++chunk) {
      const int stage = chunk * pp + rank;
      torch::Tensor input;
      if (stage > 0) {
        input = torch::empty(shape, options_);
        parallel_.forward_senders[size_t(prev)]->batch_p2p_async({{false, input, prev, int(stage * num_micro + mb)}})->wait();
      }
      auto output = forward(chunk, mb, input);
      if (stage == virtual_stages - 1) loss_sum += output.to(torch::kFloat32);
      else
        pending_sends.push_back(parallel_.forward_senders[size_t(rank)]->batch_p2p_async(
            {{true, output.contiguous(), next, int((stage + 1) * num_micro + mb)}}));
    }
  for (auto& w : pending_sends) w->wait();
  return loss_sum;
}

}  // namespace fp8tron
