// One interface for collectives over a process group: MPI on CPU tensors, NCCL on GPU tensors.
// Operations are ordered like torch.distributed's: on the GPU they are enqueued on the group's
// communication stream after the current compute stream's work, and the compute stream waits
// for them; `*_async` variants return a handle instead of making the compute stream wait, so
// compute can overlap. A collective that has not completed after --hang-report-seconds is
// reported (progress_board.h: who did not arrive, every rank's last iteration); after
// --distributed-timeout-minutes it ends the job with an error naming the group and operation.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace fp8tron {

class ProgressBoard;

enum class ReduceOp { Sum, Max, Min };

class CommWork {
 public:
  virtual ~CommWork() = default;
  // Blocks the host (CPU) or the current compute stream (GPU) until the operation is done.
  virtual void wait() = 0;
};

// Stands between a caller and the operations it waits for, to time the stall: the tensor-,
// pipeline-, expert- and data-parallel groups' observers measure the exposed communication that
// --timing-log-level reports (parallel/overlap/comm_timer.h). Set per group; groups without one
// wait directly.
class WaitObserver {
 public:
  virtual ~WaitObserver() = default;
  virtual void wait(CommWork& work) = 0;  // waits for `work`, accounting the time spent
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }

  // In place over the group.
  virtual std::unique_ptr<CommWork> all_reduce_async(torch::Tensor& tensor, ReduceOp op) = 0;
  // out holds size() chunks of in's size, concatenated along dim 0.
  virtual std::unique_ptr<CommWork> all_gather_async(torch::Tensor& out, const torch::Tensor& in) = 0;
  // in holds size() chunks along dim 0; out receives the sum of everyone's chunk rank(). MPI sums
  // the chunks in rank order (0 + 1 + 2 ...), whatever the message size, so that a reduce-scatter
  // split into pieces adds the same numbers in the same order as the whole (the overlapped linears'
  // bitwise equivalence on CPU rests on it).
  virtual std::unique_ptr<CommWork> reduce_scatter_async(torch::Tensor& out, const torch::Tensor& in) = 0;
  // Uneven variants, for pieces of a buffer whose owners hold unequal parts of it (a gradient
  // bucket that straddles the distributed optimizer's contiguous shards). `counts` has size()
  // entries, some possibly 0; piece r is the counts[r] elements after the first r pieces.
  //  - reduce_scatter_v: `in` holds all pieces; `out` (counts[rank()] elements) receives the
  //    group's sum of piece rank(). `out` may be that piece of `in` itself (in place).
  //  - all_gather_v: `out` holds all pieces; rank r contributes piece r from `in`
  //    (counts[rank()] elements), which may be that piece of `out` itself (in place).
  // NCCL runs them as one group of ncclReduce / ncclBroadcast calls, one per non-empty piece
  // rooted at its owner (as torch does for uneven reduce-scatters); MPI as MPI_Ireduce_scatter /
  // MPI_Iallgatherv.
  virtual std::unique_ptr<CommWork> reduce_scatter_v_async(torch::Tensor& out, const torch::Tensor& in,
                                                           const std::vector<int64_t>& counts) = 0;
  virtual std::unique_ptr<CommWork> all_gather_v_async(torch::Tensor& out, const torch::Tensor& in,
                                                       const std::vector<int64_t>& counts) = 0;
  // Uneven all-to-all of rows (the mixture-of-experts token exchange). A row is everything after
  // dim 0; `in` and `out` share the dtype and the row size. Rows [sum(send_rows[<r]),
  // + send_rows[r]) of `in` go to group rank r; the recv_rows[r] rows from rank r land in `out` at
  // [sum(recv_rows[<r]), ...). Counts are host values (after the dispatcher's one device-to-host
  // copy) and must pair up: rank r's send_rows[me] == my recv_rows[r]. NCCL runs one group of
  // ncclSend/ncclRecv, MPI one MPI_Ialltoallv over a row datatype.
  virtual std::unique_ptr<CommWork> all_to_all_v_async(torch::Tensor& out, const torch::Tensor& in,
                                                       const std::vector<int64_t>& send_rows,
                                                       const std::vector<int64_t>& recv_rows) = 0;
  virtual void broadcast(torch::Tensor& tensor, int root) = 0;
  // Point-to-point within the group (pipeline stages). Sends and receives issued inside one
  // batch() call progress together, so paired exchanges cannot deadlock.
  struct P2POp {
    bool is_send;
    torch::Tensor tensor;
    int peer;
    int tag = 0;  // MPI matches by tag; NCCL needs sends and receives issued in the same order
  };
  virtual std::unique_ptr<CommWork> batch_p2p_async(std::vector<P2POp> ops) = 0;
  virtual void barrier() = 0;

  void all_reduce(torch::Tensor& t, ReduceOp op = ReduceOp::Sum) { wait(*all_reduce_async(t, op)); }
  void all_gather(torch::Tensor& out, const torch::Tensor& in) { wait(*all_gather_async(out, in)); }
  void reduce_scatter(torch::Tensor& out, const torch::Tensor& in) { wait(*reduce_scatter_async(out, in)); }
  void all_to_all_v(torch::Tensor& out, const torch::Tensor& in, const std::vector<int64_t>& send_rows,
                    const std::vector<int64_t>& recv_rows) {
    wait(*all_to_all_v_async(out, in, send_rows, recv_rows));
  }

  // Waits for `work`, an operation of this group, through the group's wait observer if it has one.
  void wait(CommWork& work) {
    if (wait_observer_) wait_observer_->wait(work);
    else work.wait();
  }
  void set_wait_observer(std::shared_ptr<WaitObserver> observer) { wait_observer_ = std::move(observer); }
  // Whether some feature observes this group's waits: a communicator shared by several groups
  // (parallel_state.h) keeps the observer set first.
  bool has_wait_observer() const { return wait_observer_ != nullptr; }
  // Operations issued on this group from now on start only after `work` (an operation of this
  // group) has completed, without making the caller's compute wait: a ring that forwards the chunk
  // it just received. NCCL: nothing to do, one stream runs the group's operations in issue order.
  // MPI (and the default): the host waits for `work`, as MPI has no such ordering.
  virtual void order_after(CommWork& work) { work.wait(); }

  // Checks an uneven operation's shapes (`whole` holds every piece, `mine` this rank's) and
  // returns where each piece starts, in elements.
  std::vector<int64_t> piece_offsets(const char* op, const torch::Tensor& whole, const torch::Tensor& mine,
                                     const std::vector<int64_t>& counts) const;
  // Checks an all-to-all-v's shapes and returns the elements per row.
  int64_t check_all_to_all_v(const torch::Tensor& out, const torch::Tensor& in, const std::vector<int64_t>& send_rows,
                             const std::vector<int64_t>& recv_rows) const;

 protected:
  Communicator(std::string name, int rank, int size, std::vector<int> global_ranks)
      : name_(std::move(name)), rank_(rank), size_(size), global_ranks_(std::move(global_ranks)) {}
  std::string name_;
  int rank_, size_;
  std::vector<int> global_ranks_;
  std::shared_ptr<WaitObserver> wait_observer_;
};

// The whole job's transport. Creates group communicators; every rank of the world must call
// new_group() for every group, in the same order (as MPI_Comm_split / ncclCommSplit need).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int world_rank() const = 0;
  virtual int world_size() const = 0;
  // Where the job's ranks publish their progress for hang reports (progress_board.h); null for
  // one process, or when no side channel could be set up.
  virtual std::shared_ptr<ProgressBoard> progress_board() const { return nullptr; }
  // Whether two host threads may call it in turn (the combined 1F1B schedule's two passes,
  // all_to_all_turns.h): "" when they may, else why not.
  virtual std::string two_threads_refusal() const { return ""; }
  // `groups` partitions the world; the caller's group is returned.
  virtual std::shared_ptr<Communicator> new_group(const std::string& name, const std::vector<std::vector<int>>& groups) = 0;
};

struct LaunchEnv;
// When a collective that has not completed is reported (`report_after`, --hang-report-seconds)
// and when it ends the job (`timeout`, --distributed-timeout-minutes).
struct CommTimeouts {
  std::chrono::milliseconds timeout{600000};
  std::chrono::milliseconds report_after{90000};
};
// MPI over CPU tensors (mpirun, or a single process). Initialises MPI once per process.
std::unique_ptr<Transport> make_mpi_transport(CommTimeouts timeouts);
// NCCL over GPU tensors: ids exchanged through MPI under mpirun, else through c10d's TCPStore
// (torchrun: the agent's store; srun: MASTER_ADDR/MASTER_PORT, rank 0 hosts).
std::unique_ptr<Transport> make_nccl_transport(const LaunchEnv& env, int device, CommTimeouts timeouts);

}  // namespace fp8tron
