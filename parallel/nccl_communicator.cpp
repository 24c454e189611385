// Collectives over NCCL for GPU tensors. Each group has its own communicator and stream: an
// operation waits for the compute stream's work so far (an event), runs on the group's stream,
// and the caller's stream waits for it (now, or at CommWork::wait() for *_async).
// Point-to-point: every pipeline rank sends on a communicator of its own ("sender" comms), so a
// rank's sends and receives never queue behind each other on one stream.
// A watchdog thread turns a hang into an error naming the group, the operation and the rank.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <mpi.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "parallel/communicator.h"
#include "parallel/progress_board.h"
#include "parallel/topology.h"
#include "parallel/launch_env.h"

namespace fp8tron {
namespace {

// Whether a communicator is being destroyed by an exception on its way to main, which prints the
// error and ends the process. Destroying it would close its connections first, and the peers,
// seeing them close, would report a network error and end (their launcher then killing this
// rank) before this rank's own line is printed: the process's end closes them instead.
bool ending_on_an_error() { return std::uncaught_exceptions() > 0; }

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string("NCCL error in ") + what + ": " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return ncclFloat32;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kFloat16: return ncclFloat16;
    case torch::kFloat64: return ncclFloat64;
    case torch::kInt64: return ncclInt64;
    case torch::kInt32: return ncclInt32;
    case torch::kUInt8: return ncclUint8;
    default: throw std::runtime_error("NCCL: unsupported dtype");
  }
}
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : op == ReduceOp::Max ? ncclMax : ncclMin; }

// Watches in-flight operations: one that has not completed after --hang-report-seconds is
// reported (progress_board.h); on a timeout or an NCCL error it says so and ends the process (the other ranks'
// watchdogs or the launcher end theirs), as a hung collective cannot be recovered.
class Watchdog {
 public:
  explicit Watchdog(CommTimeouts timeouts) : timeouts_(timeouts), thread_([this] { loop(); }) {}
  ~Watchdog() {
    stop_ = true;
    thread_.join();
  }
  void set_board(std::shared_ptr<ProgressBoard> board) {
    std::lock_guard<std::mutex> lock(mutex_);
    board_ = std::move(board);
  }
  struct Op {
    std::string op, group;
    std::vector<int> members;
    uint64_t seq = 0;
    int world_rank = 0;
  };
  // One operation, watched from before its NCCL call: the call itself can block the CPU (NCCL
  // connects peers at their first operation of a kind and waits there for them), and a rank held
  // inside it must be reported like one whose kernel waits. `done` is recorded once the call has
  // returned; until then the operation counts as pending.
  struct InFlight {
    at::cuda::CUDAEvent done;
    std::atomic<bool> recorded{false};
    std::atomic<bool> abandoned{false};  // the call failed: its error is reported where it was made
  };
  void watch(std::shared_ptr<InFlight> in_flight, Op op, ncclComm_t comm) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    pending_.push_back({std::move(in_flight), now, now + timeouts_.timeout, std::move(op), comm, false});
  }
  // Drops the operations of a communicator about to be destroyed: the loop asks NCCL about an
  // operation's communicator (under the lock), which must not happen once it is freed.
  void forget(ncclComm_t comm) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(pending_, [comm](const Entry& e) { return e.comm == comm; });
  }

 private:
  struct Entry {
    std::shared_ptr<InFlight> in_flight;
    std::chrono::steady_clock::time_point issued, deadline;
    Op op;
    ncclComm_t comm;
    bool reported;
  };
  std::string what(const Op& op) const {
    return strprintf("%s on group '%s' (global rank %d)", op.op.c_str(), op.group.c_str(), op.world_rank);
  }
  void loop() {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::unique_lock<std::mutex> lock(mutex_);
      while (!pending_.empty()) {
        Entry& e = pending_.front();
        if (completed(e)) { pending_.pop_front(); continue; }
        const auto now = std::chrono::steady_clock::now();
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - e.issued);
        if (board_ && !e.reported && e.op.seq > 0 && waited >= timeouts_.report_after) {
          e.reported = true;
          // The report reads the other ranks' records (up to the board's read limit): new
          // operations may be issued meanwhile; only this thread removes entries.
          const Op op = e.op;
          lock.unlock();
          const ProgressBoard::Report r = board_->describe(op.group, op.members, op.op, op.seq, waited);
          if (r.print) {
            std::fprintf(stderr, "fp8tron: [rank %d] %s\n", op.world_rank, r.text.c_str());
            std::fflush(stderr);
          }
          lock.lock();
          continue;  // the front entry may have completed meanwhile
        }
        if (now > e.deadline)
          fail(e, "timed out after " + std::to_string(timeouts_.timeout.count() / 60000) +
                      " min (--distributed-timeout-minutes)");
        break;  // operations on one stream finish in order enough for a coarse check of the deadlines
      }
      // An NCCL error is asked of every communicator with operations in flight: the oldest
      // operation may wait on a healthy one while another's peer is gone.
      std::set<ncclComm_t> asked;
      for (const Entry& e : pending_) {
        // An abandoned operation's error is on its way to main, which prints it.
        if (e.in_flight->abandoned.load(std::memory_order_acquire) || !asked.insert(e.comm).second) continue;
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(e.comm, &async);
        if (async != ncclSuccess) fail(e, std::string("NCCL error ") + ncclGetErrorString(async));
      }
    }
  }
  [[noreturn]] void fail(const Entry& e, std::string why) const {
    if (!e.in_flight->recorded.load(std::memory_order_acquire))
      why += " (held inside the NCCL call: NCCL waits there for peers it connects)";
    std::fprintf(stderr, "fp8tron: error: %s in %s\n", why.c_str(), what(e.op).c_str());
    std::fflush(stderr);
    exit_now();
  }
  // The process ends at once, without ncclCommAbort: an abort lets the operations it cancels
  // complete, so the training thread can run on and call NCCL on the communicator being torn down
  // (the likely cause of a segmentation fault seen at such a timeout), and the abort itself can
  // wait on a stopped peer. Ending the process closes its connections, which fails the peers' pending
  // operations as an abort would; the launcher ends the ranks still running.
  [[noreturn]] static void exit_now() { std::_Exit(1); }
  // Whether the operation's event has fired. A failed kernel anywhere on the device (an illegal
  // address, say) surfaces here first, on this thread: it ends the process with one line instead
  // of an exception no one catches.
  bool completed(const Entry& e) const {
    if (e.in_flight->abandoned.load(std::memory_order_acquire)) return true;
    if (!e.in_flight->recorded.load(std::memory_order_acquire)) return false;
    try {
      return e.in_flight->done.query();
    } catch (const std::exception& error) {
      const std::string text = error.what();
      std::fprintf(stderr, "fp8tron: error: CUDA error while %s was in flight: %s\n", what(e.op).c_str(),
                   text.substr(0, text.find('\n')).c_str());
      std::fflush(stderr);
      std::_Exit(1);
    }
  }
  CommTimeouts timeouts_;
  std::shared_ptr<ProgressBoard> board_;
  std::mutex mutex_;
  std::deque<Entry> pending_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class NcclWork : public CommWork {
 public:
  explicit NcclWork(std::shared_ptr<Watchdog::InFlight> in_flight) : in_flight_(std::move(in_flight)) {}
  void wait() override { in_flight_->done.block(at::cuda::getCurrentCUDAStream()); }

 private:
  std::shared_ptr<Watchdog::InFlight> in_flight_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::string name, ncclComm_t comm, std::vector<int> global_ranks, int world_rank, int device,
                   std::shared_ptr<Watchdog> watchdog, std::shared_ptr<ProgressBoard> board)
      : Communicator(std::move(name), 0, 1, std::move(global_ranks)),
        comm_(comm),
        world_rank_(world_rank),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)),
        watchdog_(std::move(watchdog)),
        board_(std::move(board)),
        key_(ProgressBoard::group_key(name_, global_ranks_)) {
    check_nccl(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check_nccl(ncclCommCount(comm_, &size_), "ncclCommCount");
  }
  ~NcclCommunicator() override {
    watchdog_->forget(comm_);
    if (!ending_on_an_error()) ncclCommDestroy(comm_);
  }

  std::unique_ptr<CommWork> all_reduce_async(torch::Tensor& t, ReduceOp op) override {
    FP8TRON_CHECK(t.is_contiguous(), "all_reduce needs a contiguous tensor");
    return enqueue("all_reduce", {t}, [&] {
      check_nccl(ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t.scalar_type()), nccl_op(op), comm_, stream_),
                 "ncclAllReduce");
    });
  }
  std::unique_ptr<CommWork> all_gather_async(torch::Tensor& out, const torch::Tensor& in) override {
    FP8TRON_CHECK(out.is_contiguous() && in.is_contiguous() && out.numel() == in.numel() * size_, "all_gather shapes");
    return enqueue("all_gather", {out, in}, [&] {
      check_nccl(ncclAllGather(in.data_ptr(), out.data_ptr(), size_t(in.numel()), nccl_type(in.scalar_type()), comm_, stream_),
                 "ncclAllGather");
    });
  }
  std::unique_ptr<CommWork> reduce_scatter_async(torch::Tensor& out, const torch::Tensor& in) override {
    FP8TRON_CHECK(out.is_contiguous() && in.is_contiguous() && in.numel() == out.numel() * size_, "reduce_scatter shapes");
    return enqueue("reduce_scatter", {out, in}, [&] {
      check_nccl(ncclReduceScatter(in.data_ptr(), out.data_ptr(), size_t(out.numel()), nccl_type(out.scalar_type()), ncclSum, comm_,
                                   stream_),
                 "ncclReduceScatter");
    });
  }
  // Uneven pieces: one NCCL group of reductions (broadcasts) rooted at each piece's owner. A
  // non-root's recvbuff is never written; it gets its own send pointer so that no argument is null.
  std::unique_ptr<CommWork> reduce_scatter_v_async(torch::Tensor& out, const torch::Tensor& in,
                                                   const std::vector<int64_t>& counts) override {
    const auto offsets = piece_offsets("reduce_scatter_v", in, out, counts);
    return enqueue("reduce_scatter_v", {out, in}, [&] {
      const auto type = nccl_type(in.scalar_type());
      auto* base = static_cast<char*>(in.data_ptr());
      const int64_t element = in.element_size();
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      for (int r = 0; r < size_; ++r) {
        if (counts[size_t(r)] == 0) continue;
        void* piece = base + offsets[size_t(r)] * element;
        check_nccl(ncclReduce(piece, r == rank_ ? out.data_ptr() : piece, size_t(counts[size_t(r)]), type, ncclSum, r, comm_, stream_),
                   "ncclReduce");
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    });
  }
  std::unique_ptr<CommWork> all_gather_v_async(torch::Tensor& out, const torch::Tensor& in,
                                               const std::vector<int64_t>& counts) override {
    const auto offsets = piece_offsets("all_gather_v", out, in, counts);
    return enqueue("all_gather_v", {out, in}, [&] {
      const auto type = nccl_type(out.scalar_type());
      auto* base = static_cast<char*>(out.data_ptr());
      const int64_t element = out.element_size();
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      for (int r = 0; r < size_; ++r) {
        if (counts[size_t(r)] == 0) continue;
        void* piece = base + offsets[size_t(r)] * element;
        check_nccl(ncclBroadcast(r == rank_ ? in.data_ptr() : piece, piece, size_t(counts[size_t(r)]), type, r, comm_, stream_),
                   "ncclBroadcast");
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    });
  }
  // One NCCL group of point-to-point calls: each peer's rows as bytes (any dtype, FP8 included);
  // the self block goes through the group too (NCCL pairs a rank's send and receive to itself).
  std::unique_ptr<CommWork> all_to_all_v_async(torch::Tensor& out, const torch::Tensor& in,
                                               const std::vector<int64_t>& send_rows,
                                               const std::vector<int64_t>& recv_rows) override {
    const int64_t row_bytes = check_all_to_all_v(out, in, send_rows, recv_rows) * int64_t(in.element_size());
    return enqueue("all_to_all_v", {out, in}, [&] {
      const auto* send = static_cast<const char*>(in.data_ptr());
      auto* recv = static_cast<char*>(out.data_ptr());
      int64_t send_at = 0, recv_at = 0;
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      for (int r = 0; r < size_; ++r) {
        const int64_t s = send_rows[size_t(r)], v = recv_rows[size_t(r)];
        if (s > 0) check_nccl(ncclSend(send + send_at * row_bytes, size_t(s * row_bytes), ncclUint8, r, comm_, stream_), "ncclSend");
        if (v > 0) check_nccl(ncclRecv(recv + recv_at * row_bytes, size_t(v * row_bytes), ncclUint8, r, comm_, stream_), "ncclRecv");
        send_at += s;
        recv_at += v;
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    });
  }
  void broadcast(torch::Tensor& t, int root) override {
    FP8TRON_CHECK(t.is_contiguous(), "broadcast needs a contiguous tensor");
    enqueue("broadcast", {t}, [&] {
      check_nccl(ncclBroadcast(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t.scalar_type()), root, comm_, stream_),
                 "ncclBroadcast");
    })->wait();
  }
  std::unique_ptr<CommWork> batch_p2p_async(std::vector<P2POp> ops) override {
    std::vector<torch::Tensor> tensors;
    for (auto& op : ops) tensors.push_back(op.tensor);
    return enqueue("send/recv", tensors, [&] {
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      for (auto& op : ops) {
        const size_t bytes = size_t(op.tensor.numel() * op.tensor.element_size());
        if (op.is_send) check_nccl(ncclSend(op.tensor.data_ptr(), bytes, ncclUint8, op.peer, comm_, stream_), "ncclSend");
        else check_nccl(ncclRecv(op.tensor.data_ptr(), bytes, ncclUint8, op.peer, comm_, stream_), "ncclRecv");
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    });
  }
  // The group's operations run on its one stream in issue order: a later one already follows `work`.
  void order_after(CommWork&) override {}
  void barrier() override {
    auto t = torch::zeros({1}, torch::TensorOptions().device(torch::kCUDA, stream_.device_index()));
    all_reduce(t);
    at::cuda::getCurrentCUDAStream().synchronize();
  }

 private:
  template <typename F>
  std::unique_ptr<CommWork> enqueue(const char* op, const std::vector<torch::Tensor>& tensors, F&& issue) {
    auto compute = at::cuda::getCurrentCUDAStream();
    at::cuda::CUDAEvent ready;
    ready.record(compute);
    ready.block(stream_);
    // The caching allocator must not hand these buffers out again before the stream is done.
    for (const auto& t : tensors)
      if (t.storage().data() != nullptr) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    const uint64_t seq = board_ && size_ > 1 ? board_->entered(key_) : 0;
    auto watched = std::make_shared<Watchdog::InFlight>();
    watchdog_->watch(watched, Watchdog::Op{op, name_, global_ranks_, seq, world_rank_}, comm_);
    try {
      // While the call holds this thread, the others' reports say where it waits.
      if (seq > 0) board_->waiting(key_, op, seq);
      {
        c10::cuda::CUDAStreamGuard guard(stream_);
        issue();
      }
      watched->done.record(stream_);
      watched->recorded.store(true, std::memory_order_release);
    } catch (...) {
      watched->abandoned.store(true, std::memory_order_release);
      if (seq > 0) board_->done_waiting();
      throw;
    }
    if (seq > 0) board_->done_waiting();
    return std::make_unique<NcclWork>(std::move(watched));
  }

  ncclComm_t comm_;
  int world_rank_;
  c10::cuda::CUDAStream stream_;
  std::shared_ptr<Watchdog> watchdog_;  // shared: a group may outlive the transport that made it
  std::shared_ptr<ProgressBoard> board_;
  std::string key_;

  friend class NcclTransport;
};

void ensure_mpi_for_nccl() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  // Serialized, as the MPI transport asks (parallel/all_to_all_turns.h).
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  std::atexit([] { int f = 0; MPI_Finalized(&f); if (!f) MPI_Finalize(); });
}

// The job's key-value store outside mpirun: torchrun's agent store when it provides one, else one
// rank 0 hosts at MASTER_ADDR:MASTER_PORT (srun). It stays up for the whole job: the NCCL id goes
// through it, then the progress board (hang reports).
std::shared_ptr<c10d::Store> make_launcher_store(const LaunchEnv& env, std::chrono::milliseconds timeout) {
  if (env.master_addr.empty()) throw UserError("multi-GPU runs need MASTER_ADDR and MASTER_PORT (or launch with mpirun/torchrun)");
  c10d::TCPStoreOptions options;
  options.port = uint16_t(env.master_port);
  options.isServer = env.rank == 0 && !env.agent_store;
  options.numWorkers = env.world_size;
  options.waitWorkers = false;
  options.timeout = timeout;
  return std::make_shared<c10d::TCPStore>(env.master_addr, options);
}

// Exchanges the world's ncclUniqueId: MPI under mpirun, else the launcher's store. A process can
// build several worlds one after another (tests train several layouts in one job); torchrun's
// agent store outlives them all, so each world's id has a key of its own, numbered alike on every
// rank, and no rank can read the id of an earlier world.
ncclUniqueId exchange_unique_id(const LaunchEnv& env, c10d::Store* store) {
  static int worlds_built = 0;
  const int world_number = worlds_built++;
  ncclUniqueId id{};
  if (env.rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (!store) {
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    return id;
  }
  const std::string key = "fp8tron/nccl_unique_id/" + std::to_string(world_number);
  if (env.rank == 0) {
    std::vector<uint8_t> bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id);
    store->set(key, bytes);
  }
  auto bytes = store->get(key);
  FP8TRON_CHECK(bytes.size() == sizeof id, "bad NCCL id from the store");
  std::memcpy(&id, bytes.data(), sizeof id);
  return id;
}

// ncclCommInitRank waits for every rank of the world without a time limit: a rank that never
// arrives (it failed before, or cannot reach the others) would hold the rest forever. The call
// runs on a helper thread, and the rank gives up after --distributed-timeout-minutes with one line;
// the helper, stuck in NCCL, ends with the process.
ncclComm_t init_world(ncclUniqueId id, int size, int rank, int device, std::chrono::milliseconds timeout) {
  struct Call {
    std::mutex mutex;
    std::condition_variable finished;
    bool done = false;
    ncclComm_t comm{};
    ncclResult_t result = ncclSuccess;
  };
  auto call = std::make_shared<Call>();
  std::thread([call, id, size, rank, device] {
    c10::cuda::set_device(device);
    ncclComm_t comm{};
    const ncclResult_t result = ncclCommInitRank(&comm, size, id, rank);
    std::lock_guard<std::mutex> lock(call->mutex);
    call->comm = comm;
    call->result = result;
    call->done = true;
    call->finished.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(call->mutex);
  if (!call->finished.wait_for(lock, timeout, [&] { return call->done; }))
    throw UserError(strprintf("NCCL could not connect the %d ranks within %lld min (--distributed-timeout-minutes): a rank "
                              "did not start or cannot reach the others; NCCL_DEBUG=INFO shows how far each got",
                              size, static_cast<long long>(timeout.count() / 60000)));
  check_nccl(call->result, "ncclCommInitRank");
  return call->comm;
}

class NcclTransport : public Transport {
 public:
  NcclTransport(const LaunchEnv& env, int device, CommTimeouts timeouts)
      : rank_(env.rank), size_(env.world_size), device_(device), watchdog_(std::make_shared<Watchdog>(timeouts)) {
    c10::cuda::set_device(device);
    std::shared_ptr<c10d::Store> store;
    if (env.launcher == "mpirun") {
      ensure_mpi_for_nccl();
    } else {
      store = make_launcher_store(env, timeouts.timeout);
    }
    ncclUniqueId id = exchange_unique_id(env, store.get());
    world_ = init_world(id, size_, rank_, device, timeouts.timeout);
    if (size_ > 1) {
      if (!store) store = make_mpi_side_channel(rank_, size_, timeouts.timeout);
      if (store) board_ = std::make_shared<ProgressBoard>(store, rank_, size_, ProgressBoard::Options{timeouts.report_after, timeouts.timeout});
      watchdog_->set_board(board_);
    }
  }
  ~NcclTransport() override {
    if (!ending_on_an_error()) ncclCommDestroy(world_);
  }
  int world_rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::shared_ptr<ProgressBoard> progress_board() const override { return board_; }

  std::shared_ptr<Communicator> new_group(const std::string& name, const std::vector<std::vector<int>>& groups) override {
    const GroupMembership m = membership_of(groups, rank_, name);
    ncclComm_t comm;
    check_nccl(ncclCommSplit(world_, m.color, m.key, &comm, nullptr), "ncclCommSplit");
    return std::make_shared<NcclCommunicator>(name, comm, m.members, rank_, device_, watchdog_, board_);
  }

 private:
  int rank_, size_, device_;
  ncclComm_t world_{};
  std::shared_ptr<ProgressBoard> board_;
  std::shared_ptr<Watchdog> watchdog_;
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(const LaunchEnv& env, int device, CommTimeouts timeouts) {
  return std::make_unique<NcclTransport>(env, device, timeouts);
}

}  // namespace fp8tron
