// Hangs named fast. A collective that never completes is, from one rank, indistinguishable from a
// slow one: the rank cannot see who has not arrived. So every rank keeps a small record of what it
// is doing -- the last iteration it finished and, per process group, how many collectives it has
// entered and the one it is waiting in -- and a background thread publishes it every second to a
// side channel every rank can read without taking part in a collective: a c10d key-value store
// (a TCPStore hosted by rank 0's process; torchrun's agent store under torchrun).
//
// When a collective has waited --hang-report-seconds (90 by default), the waiting rank reads every
// rank's record and reports, in one line: the group, the operation and its number on that group,
// the ranks of the group that have not entered it (what each is doing instead, how long ago it last
// published -- a stopped or dead process stops publishing) and every rank's last finished
// iteration. Only the lowest-numbered waiting rank of the group prints it. The job still ends only
// after --distributed-timeout-minutes.
//
// The store may live in the very process that hangs (rank 0 hosts it under mpirun), and a read from
// a stopped process can block forever. So every store call runs on the board's own thread: a
// report waits for the records at most `read_limit` and otherwise says that the store's host does
// not answer; a board whose thread is stuck in the store is left behind at destruction instead of
// joined. Nothing that reports or ends a hung job waits on the rank that hangs.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace c10d {
class Store;
}

namespace fp8tron {

class ProgressBoard {
 public:
  struct Options {
    std::chrono::milliseconds report_after{90000};   // --hang-report-seconds
    std::chrono::milliseconds hard_limit{600000};    // --distributed-timeout-minutes
    std::chrono::milliseconds publish_every{1000};
    std::chrono::milliseconds read_limit{15000};     // how long a report waits for the records
  };
  // `store` is shared by every rank of the job; `rank` and `world_size` are global.
  ProgressBoard(std::shared_ptr<c10d::Store> store, int rank, int world_size, Options options);
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  const Options& options() const { return options_; }

  // The trainer, after each iteration (published within 200 ms).
  void iteration_finished(int64_t iteration);

  // Communicators. A group is named by its name and its members' global ranks ("dp[0,2]").
  static std::string group_key(const std::string& name, const std::vector<int>& members);
  // A collective is entered on the group (counted before its call, which may block): returns its
  // number there (1, 2, ...).
  uint64_t entered(const std::string& key);
  // This rank blocks on collective `seq` of the group (`op`) from now until done_waiting().
  void waiting(const std::string& key, const std::string& op, uint64_t seq);
  void done_waiting();

  // The report of a collective this rank has waited `waited` for (one line), and whether this rank
  // is the one to print it (the lowest-numbered member that has entered it). Returns within
  // options().read_limit whatever the store does.
  struct Report {
    std::string text;
    bool print = false;
  };
  Report describe(const std::string& group_name, const std::vector<int>& members, const std::string& op, uint64_t seq,
                  std::chrono::milliseconds waited);

  // Publishes this rank's record now and waits until it is written (at most read_limit); the
  // background thread publishes every publish_every anyway.
  void publish();

  struct Record;  // one rank's published state (progress_board.cpp)
  struct State;   // this rank's record and the requests to the board's thread, shared with it

 private:
  Options options_;
  int rank_, world_size_;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

// The side channel for mpirun jobs: rank 0 hosts a TCPStore on a free port and tells the others
// where it is over MPI (MPI_COMM_WORLD must be initialised). Null when it cannot be set up (the
// collectives then work without hang reports, with one warning).
std::shared_ptr<c10d::Store> make_mpi_side_channel(int rank, int world_size, std::chrono::milliseconds timeout);

}  // namespace fp8tron
