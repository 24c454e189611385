// Collectives over MPI for CPU tensors. MPI has no 16-bit float types: bf16/fp16 reductions go
// through an fp32 copy (CPU runs are for correctness tests, not speed).
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/text.h"
#include "parallel/communicator.h"
#include "parallel/progress_board.h"
#include "parallel/topology.h"

namespace fp8tron {
namespace {

void check_mpi(int code, const char* what) {
  if (code != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, text, &len);
    throw std::runtime_error(std::string("MPI error in ") + what + ": " + std::string(text, size_t(len)));
  }
}

MPI_Datatype mpi_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return MPI_FLOAT;
    case torch::kFloat64: return MPI_DOUBLE;
    case torch::kInt64: return MPI_INT64_T;
    case torch::kInt32: return MPI_INT32_T;
    case torch::kUInt8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : op == ReduceOp::Max ? MPI_MAX : MPI_MIN; }

void ensure_mpi() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // Serialized: the combined 1F1B schedule's two passes call MPI from two threads, one at a
      // time (parallel/all_to_all_turns.h).
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    }
  });
}

// Requests to complete, then an action (e.g. copy an fp32 result back into a bf16 tensor). While
// it waits, the progress board knows (hang reports), and a wait past the report time is reported
// once; past --distributed-timeout-minutes it is an error.
struct MpiOp {
  std::string op, group, key;
  std::vector<int> members;
  uint64_t seq = 0;  // its number on the group (progress board)
  int world_rank = 0;
  std::shared_ptr<ProgressBoard> board;
  CommTimeouts timeouts;
};

class MpiWork : public CommWork {
 public:
  explicit MpiWork(MpiOp op) : op_(std::move(op)) {}
  std::vector<MPI_Request> requests;
  std::function<void()> finish;
  std::vector<torch::Tensor> keep_alive;

  void wait() override {
    if (done_) return;
    const auto start = std::chrono::steady_clock::now();
    if (op_.board) op_.board->waiting(op_.key, op_.op, op_.seq);
    bool reported = false;
    std::string report;
    for (;;) {
      int flag = 0;
      check_mpi(MPI_Testall(int(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE), what().c_str());
      if (flag) break;
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      if (op_.board && !reported && waited >= op_.timeouts.report_after) {
        reported = true;
        const ProgressBoard::Report r = op_.board->describe(op_.group, op_.members, op_.op, op_.seq, waited);
        // Repeated in the timeout's line, where its times would read as stale without their moment.
        report = strprintf("at the report after %.0f s, %s", double(waited.count()) / 1000.0, r.text.c_str());
        if (r.print) {
          std::fprintf(stderr, "fp8tron: [rank %d] %s\n", op_.world_rank, r.text.c_str());
          std::fflush(stderr);
        }
      }
      if (waited > op_.timeouts.timeout) give_up(report);
      std::this_thread::sleep_for(std::chrono::microseconds(20));  // yield: ranks may share cores
    }
    if (op_.board) op_.board->done_waiting();
    if (finish) finish();
    done_ = true;
  }
  ~MpiWork() override {
    if (!done_) try { wait(); } catch (...) {}
  }

 private:
  std::string what() const {
    return strprintf("%s on group '%s' (global rank %d)", op_.op.c_str(), op_.group.c_str(), op_.world_rank);
  }
  // A collective past --distributed-timeout-minutes cannot be recovered, and an orderly exit would
  // wait on the missing rank again (MPI_Finalize, a checkpoint's agreement): the process ends here,
  // non-zero, and mpirun ends the other ranks.
  [[noreturn]] void give_up(const std::string& report) const {
    std::fprintf(stderr, "fp8tron: error: timed out after %lld min (--distributed-timeout-minutes) in %s%s%s\n",
                 (long long)(op_.timeouts.timeout.count() / 60000), what().c_str(), report.empty() ? "" : "; ",
                 report.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  MpiOp op_;
  bool done_ = false;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(std::string name, MPI_Comm comm, std::vector<int> global_ranks, int world_rank, CommTimeouts timeouts,
                  std::shared_ptr<ProgressBoard> board)
      : Communicator(std::move(name), 0, 1, std::move(global_ranks)),
        comm_(comm),
        world_rank_(world_rank),
        timeouts_(timeouts),
        board_(std::move(board)),
        key_(ProgressBoard::group_key(name_, global_ranks_)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }

  std::unique_ptr<CommWork> all_reduce_async(torch::Tensor& tensor, ReduceOp op) override {
    auto work = make_work("all_reduce");
    auto buf = reduction_buffer(tensor);
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf.data_ptr(), int(buf.numel()), mpi_type(buf.scalar_type()), mpi_op(op), comm_,
                             &add(*work)),
              "MPI_Iallreduce");
    if (!buf.is_same(tensor)) work->finish = [tensor, buf]() mutable { tensor.copy_(buf); };
    work->keep_alive = {tensor, buf};
    return work;
  }

  std::unique_ptr<CommWork> all_gather_async(torch::Tensor& out, const torch::Tensor& in) override {
    FP8TRON_CHECK(out.is_contiguous() && in.is_contiguous(), "all_gather needs contiguous tensors");
    FP8TRON_CHECK(out.numel() == in.numel() * size_, "all_gather: output must hold size x input");
    auto work = make_work("all_gather");
    const int bytes = int(in.numel() * in.element_size());
    check_mpi(MPI_Iallgather(in.data_ptr(), bytes, MPI_BYTE, out.data_ptr(), bytes, MPI_BYTE, comm_, &add(*work)),
              "MPI_Iallgather");
    work->keep_alive = {out, in};
    return work;
  }

  // An all-to-all of the pieces, then their sum in rank order on each rank: MPI's own
  // reduce-scatter picks its algorithm (and so the order of the additions) by message size.
  std::unique_ptr<CommWork> reduce_scatter_async(torch::Tensor& out, const torch::Tensor& in) override {
    FP8TRON_CHECK(in.numel() == out.numel() * size_, "reduce_scatter: input must hold size x output");
    auto work = make_work("reduce_scatter");
    auto src = reduction_buffer(in);
    auto pieces = torch::empty({int64_t(size_), out.numel()}, src.options());
    FP8TRON_CHECK(out.numel() <= INT32_MAX, "reduce_scatter: too large for one MPI call");
    check_mpi(MPI_Ialltoall(src.data_ptr(), int(out.numel()), mpi_type(src.scalar_type()), pieces.data_ptr(),
                            int(out.numel()), mpi_type(src.scalar_type()), comm_, &add(*work)),
              "MPI_Ialltoall");
    work->finish = [out, pieces]() mutable {
      auto sum = pieces[0].clone();
      for (int64_t s = 1; s < pieces.size(0); ++s) sum.add_(pieces[s]);
      out.copy_(sum.view(out.sizes()));
    };
    work->keep_alive = {out, src, pieces};
    return work;
  }

  // Likewise uneven: every rank's copy of piece r goes to rank r (an all-to-all), which sums them
  // in rank order. So a buffer's reduction gives the same bits whether it runs as one
  // reduce-scatter or piece by piece (gradient buckets, sharded gradients' units).
  std::unique_ptr<CommWork> reduce_scatter_v_async(torch::Tensor& out, const torch::Tensor& in,
                                                   const std::vector<int64_t>& counts) override {
    piece_offsets("reduce_scatter_v", in, out, counts);
    auto work = make_work("reduce_scatter_v");
    auto src = reduction_buffer(in);
    const int64_t mine = counts[size_t(rank_)];
    // A buffer of its own: MPI forbids the result to alias the input (`out` is often a piece of it).
    auto pieces = torch::empty({int64_t(size_), mine}, src.options());
    const std::vector<int> send_counts = to_int(counts, 1, "reduce_scatter_v");
    std::vector<int> send_displs(size_t(size_), 0), recv_counts(size_t(size_), 0), recv_displs(size_t(size_), 0);
    int64_t at = 0;
    for (int r = 0; r < size_; ++r) {
      FP8TRON_CHECK(at <= INT32_MAX && int64_t(r) * mine <= INT32_MAX, "reduce_scatter_v: too large for one MPI call");
      send_displs[size_t(r)] = int(at);
      at += counts[size_t(r)];
      recv_counts[size_t(r)] = int(mine);
      recv_displs[size_t(r)] = int(int64_t(r) * mine);
    }
    const MPI_Datatype type = mpi_type(src.scalar_type());
    check_mpi(MPI_Ialltoallv(src.data_ptr(), send_counts.data(), send_displs.data(), type, pieces.data_ptr(),
                             recv_counts.data(), recv_displs.data(), type, comm_, &add(*work)),
              "MPI_Ialltoallv");
    work->finish = [out, pieces]() mutable {
      if (pieces.size(1) == 0) return;
      auto sum = pieces[0].clone();
      for (int64_t s = 1; s < pieces.size(0); ++s) sum.add_(pieces[s]);
      out.copy_(sum.view(out.sizes()));
    };
    work->keep_alive = {out, src, pieces};
    return work;
  }

  std::unique_ptr<CommWork> all_gather_v_async(torch::Tensor& out, const torch::Tensor& in,
                                               const std::vector<int64_t>& counts) override {
    const auto offsets = piece_offsets("all_gather_v", out, in, counts);
    FP8TRON_CHECK(out.device().is_cpu(), "the MPI transport works on CPU tensors");
    auto work = make_work("all_gather_v");
    const int64_t element = out.element_size();
    const std::vector<int> bytes = to_int(counts, element, "all_gather_v");
    const std::vector<int> displacements = to_int(offsets, element, "all_gather_v");
    auto* base = static_cast<char*>(out.data_ptr());
    const bool in_place = in.numel() == 0 || in.data_ptr() == base + offsets[size_t(rank_)] * element;
    check_mpi(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : in.data_ptr(), bytes[size_t(rank_)], MPI_BYTE, base, bytes.data(),
                              displacements.data(), MPI_BYTE, comm_, &add(*work)),
              "MPI_Iallgatherv");
    work->keep_alive = {out, in};
    return work;
  }

  // Counts and displacements in rows of a contiguous row datatype, so ints reach far (OpenMPI 4
  // has no large-count MPI-4 calls). The datatype lives until the request completes.
  std::unique_ptr<CommWork> all_to_all_v_async(torch::Tensor& out, const torch::Tensor& in,
                                               const std::vector<int64_t>& send_rows,
                                               const std::vector<int64_t>& recv_rows) override {
    const int64_t row_elements = check_all_to_all_v(out, in, send_rows, recv_rows);
    FP8TRON_CHECK(in.device().is_cpu() && out.device().is_cpu(), "the MPI transport works on CPU tensors");
    auto work = make_work("all_to_all_v");
    const int64_t row_bytes = row_elements * int64_t(in.element_size());
    FP8TRON_CHECK(row_bytes > 0 && row_bytes <= INT32_MAX, "all_to_all_v: rows too large for one MPI call");
    auto type = std::make_shared<MPI_Datatype>();
    check_mpi(MPI_Type_contiguous(int(row_bytes), MPI_BYTE, type.get()), "MPI_Type_contiguous");
    check_mpi(MPI_Type_commit(type.get()), "MPI_Type_commit");
    auto displacements = [](const std::vector<int64_t>& counts) {
      std::vector<int64_t> d(counts.size(), 0);
      for (size_t r = 1; r < counts.size(); ++r) d[r] = d[r - 1] + counts[r - 1];
      return d;
    };
    // Held by the work: MPI reads the count arrays until the request completes.
    auto arrays = std::make_shared<std::vector<std::vector<int>>>(std::vector<std::vector<int>>{
        to_int(send_rows, 1, "all_to_all_v"), to_int(displacements(send_rows), 1, "all_to_all_v"),
        to_int(recv_rows, 1, "all_to_all_v"), to_int(displacements(recv_rows), 1, "all_to_all_v")});
    // MPI needs valid buffer pointers even for zero rows.
    static char empty = 0;
    void* send = in.numel() > 0 ? const_cast<void*>(in.data_ptr()) : &empty;
    void* recv = out.numel() > 0 ? out.data_ptr() : &empty;
    auto& a = *arrays;
    check_mpi(MPI_Ialltoallv(send, a[0].data(), a[1].data(), *type, recv, a[2].data(), a[3].data(), *type, comm_, &add(*work)),
              "MPI_Ialltoallv");
    work->finish = [type, arrays]() { MPI_Type_free(type.get()); };
    work->keep_alive = {out, in};
    return work;
  }

  void broadcast(torch::Tensor& tensor, int root) override {
    FP8TRON_CHECK(tensor.is_contiguous(), "broadcast needs a contiguous tensor");
    auto work = make_work("broadcast");
    check_mpi(MPI_Ibcast(tensor.data_ptr(), int(tensor.numel() * tensor.element_size()), MPI_BYTE, root, comm_, &add(*work)),
              "MPI_Ibcast");
    work->wait();
  }

  std::unique_ptr<CommWork> batch_p2p_async(std::vector<P2POp> ops) override {
    auto work = make_work("send/recv");
    for (auto& op : ops) {
      FP8TRON_CHECK(op.tensor.is_contiguous(), "p2p needs contiguous tensors");
      const int bytes = int(op.tensor.numel() * op.tensor.element_size());
      if (op.is_send)
        check_mpi(MPI_Isend(op.tensor.data_ptr(), bytes, MPI_BYTE, op.peer, op.tag, comm_, &add(*work)), "MPI_Isend");
      else
        check_mpi(MPI_Irecv(op.tensor.data_ptr(), bytes, MPI_BYTE, op.peer, op.tag, comm_, &add(*work)), "MPI_Irecv");
      work->keep_alive.push_back(op.tensor);
    }
    return work;
  }

  void barrier() override {
    auto work = make_work("barrier");
    check_mpi(MPI_Ibarrier(comm_, &add(*work)), "MPI_Ibarrier");
    work->wait();
  }

 private:
  std::unique_ptr<MpiWork> make_work(const char* op) {
    MpiOp o{op, name_, key_, global_ranks_, 0, world_rank_, board_, timeouts_};
    if (board_ && size_ > 1) o.seq = board_->entered(key_);
    else o.board = nullptr;  // a group of one cannot hang
    return std::make_unique<MpiWork>(std::move(o));
  }
  static MPI_Request& add(MpiWork& w) {
    w.requests.push_back(MPI_REQUEST_NULL);
    return w.requests.back();
  }
  // MPI counts are ints: values (times `scale`) must fit.
  static std::vector<int> to_int(const std::vector<int64_t>& values, int64_t scale, const char* op) {
    std::vector<int> out;
    for (int64_t v : values) {
      FP8TRON_CHECK(v * scale <= INT32_MAX, std::string(op) + ": too large for one MPI call");
      out.push_back(int(v * scale));
    }
    return out;
  }
  // A contiguous tensor of an MPI reduction type holding `t`'s values (t itself when possible).
  static torch::Tensor reduction_buffer(const torch::Tensor& t) {
    FP8TRON_CHECK(t.device().is_cpu(), "the MPI transport works on CPU tensors");
    if (t.is_contiguous() && mpi_type(t.scalar_type()) != MPI_DATATYPE_NULL) return t;
    return t.to(torch::kFloat32).contiguous();
  }

  MPI_Comm comm_;
  int world_rank_;
  CommTimeouts timeouts_;
  std::shared_ptr<ProgressBoard> board_;
  std::string key_;
};

class MpiTransport : public Transport {
 public:
  std::string two_threads_refusal() const override {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided >= MPI_THREAD_SERIALIZED) return "";
    return "this MPI library grants thread support level " + std::to_string(provided) +
           ", below MPI_THREAD_SERIALIZED, which the combined 1F1B schedule's two passes need (they call MPI "
           "from two threads in turn); use an MPI built with thread support";
  }
  explicit MpiTransport(CommTimeouts timeouts) : timeouts_(timeouts) {
    ensure_mpi();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    if (size_ > 1) {
      if (auto store = make_mpi_side_channel(rank_, size_, timeouts_.timeout))
        board_ = std::make_shared<ProgressBoard>(std::move(store), rank_, size_,
                                                 ProgressBoard::Options{timeouts_.report_after, timeouts_.timeout});
    }
  }
  int world_rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::shared_ptr<ProgressBoard> progress_board() const override { return board_; }

  std::shared_ptr<Communicator> new_group(const std::string& name, const std::vector<std::vector<int>>& groups) override {
    const GroupMembership m = membership_of(groups, rank_, name);
    MPI_Comm comm;
    check_mpi(MPI_Comm_split(MPI_COMM_WORLD, m.color, m.key, &comm), "MPI_Comm_split");
    return std::make_shared<MpiCommunicator>(name, comm, m.members, rank_, timeouts_, board_);
  }

 private:
  CommTimeouts timeouts_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<ProgressBoard> board_;
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(CommTimeouts timeouts) {
  return std::make_unique<MpiTransport>(timeouts);
}

}  // namespace fp8tron
