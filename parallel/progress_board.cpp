#include "parallel/progress_board.h"

#include <mpi.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "core/log.h"
#include "core/text.h"

namespace fp8tron {
namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string record_key(int rank) { return "fp8tron/progress/" + std::to_string(rank); }

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

}  // namespace

struct ProgressBoard::Record {
  bool present = false;
  int64_t iteration = 0;
  int64_t published_ms = 0;
  std::string wait_key, wait_op;
  uint64_t wait_seq = 0;
  int64_t wait_since_ms = 0;
  std::map<std::string, uint64_t> entered;
};

// Everything the board's thread touches. The thread holds a reference of its own, so a board can be
// destroyed while its thread is stuck in a store call that never returns.
struct ProgressBoard::State {
  std::shared_ptr<c10d::Store> store;
  int rank = 0, world_size = 1;
  std::mutex mutex;  // guards every member below
  std::condition_variable wake;
  // This rank's record.
  int64_t last_iteration = 0;
  std::map<std::string, uint64_t> entered;
  std::string wait_key, wait_op;
  uint64_t wait_seq = 0;
  int64_t wait_since_ms = 0;
  bool iteration_changed = false;
  // Requests to the thread and its answers, counted so that a waiter knows its own.
  uint64_t publishes_asked = 0, publishes_done = 0;
  uint64_t reads_asked = 0, reads_done = 0;
  std::vector<Record> read_records;
  bool read_ok = false;
  bool stop = false, exited = false;

  std::string serialize_locked() const {
    std::ostringstream os;
    os << "iteration " << last_iteration << "\npublished " << now_ms() << "\n";
    if (!wait_key.empty()) os << "wait " << wait_seq << " " << wait_since_ms << " " << wait_op << " " << wait_key << "\n";
    for (const auto& [key, n] : entered) os << "group " << n << " " << key << "\n";
    return os.str();
  }
};

namespace {

ProgressBoard::Record parse_record(const std::string& text) {
  ProgressBoard::Record r;
  r.present = true;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    if (word == "iteration") in >> r.iteration;
    else if (word == "published") in >> r.published_ms;
    else if (word == "wait") in >> r.wait_seq >> r.wait_since_ms >> r.wait_op >> r.wait_key;
    else if (word == "group") {
      uint64_t n = 0;
      std::string key;
      in >> n >> key;
      r.entered[key] = n;
    }
  }
  return r;
}

// Every other rank's record; throws when the store fails (or times out on its own).
std::vector<ProgressBoard::Record> read_records(c10d::Store& store, int rank, int world_size) {
  std::vector<ProgressBoard::Record> records(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    if (r == rank || !store.check({record_key(r)})) continue;
    const auto bytes = store.get(record_key(r));
    records[size_t(r)] = parse_record(std::string(bytes.begin(), bytes.end()));
  }
  return records;
}

// The board's thread: publishes this rank's record every publish_every (within 200 ms of a
// finished iteration, at most five times a second) and answers requests. Every store call of the
// board happens here.
void board_loop(std::shared_ptr<ProgressBoard::State> s, std::chrono::milliseconds publish_every) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kMinGap = std::chrono::milliseconds(200);
  std::unique_lock<std::mutex> lock(s->mutex);
  auto last_publish = Clock::now() - kMinGap;
  const auto asked = [&] { return s->publishes_asked > s->publishes_done || s->reads_asked > s->reads_done; };
  while (!s->stop) {
    s->wake.wait_until(lock, last_publish + publish_every, [&] { return s->stop || asked() || s->iteration_changed; });
    // A finished iteration waits out the minimum gap; a request does not.
    if (!asked()) s->wake.wait_until(lock, last_publish + kMinGap, [&] { return s->stop || asked(); });
    if (s->stop) break;
    const uint64_t publish_ticket = s->publishes_asked, read_ticket = s->reads_asked;
    const bool read = read_ticket > s->reads_done;
    s->iteration_changed = false;
    const std::string text = s->serialize_locked();
    lock.unlock();
    try {
      s->store->set(record_key(s->rank), std::vector<uint8_t>(text.begin(), text.end()));
    } catch (const std::exception&) {
      // The side channel is down (e.g. its host process stopped): the next publish retries.
    }
    last_publish = Clock::now();
    std::vector<ProgressBoard::Record> records;
    bool ok = true;
    if (read) {
      try {
        records = read_records(*s->store, s->rank, s->world_size);
      } catch (const std::exception&) {
        ok = false;
      }
    }
    lock.lock();
    s->publishes_done = publish_ticket;
    if (read) {
      s->read_records = std::move(records);
      s->read_ok = ok;
      s->reads_done = read_ticket;
    }
    s->wake.notify_all();
  }
  s->exited = true;
  s->wake.notify_all();
}

}  // namespace

ProgressBoard::ProgressBoard(std::shared_ptr<c10d::Store> store, int rank, int world_size, Options options)
    : options_(options), rank_(rank), world_size_(world_size), state_(std::make_shared<State>()) {
  state_->store = std::move(store);
  state_->rank = rank;
  state_->world_size = world_size;
  thread_ = std::thread(board_loop, state_, options_.publish_every);
  publish();  // every rank's record exists before the first collective can hang
}

ProgressBoard::~ProgressBoard() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->stop = true;
  state_->wake.notify_all();
  // A thread stuck in a store call whose host is gone is left behind (it owns what it uses).
  const bool exited = state_->wake.wait_for(lock, std::chrono::seconds(2), [&] { return state_->exited; });
  lock.unlock();
  if (exited) thread_.join();
  else thread_.detach();
}

std::string ProgressBoard::group_key(const std::string& name, const std::vector<int>& members) {
  std::string key = name + "[";
  for (size_t i = 0; i < members.size(); ++i) {
    if (i) key += ',';
    key += std::to_string(members[i]);
  }
  return key + "]";
}

void ProgressBoard::iteration_finished(int64_t iteration) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->last_iteration = iteration;
  state_->iteration_changed = true;
  state_->wake.notify_all();
}

uint64_t ProgressBoard::entered(const std::string& key) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return ++state_->entered[key];
}

void ProgressBoard::waiting(const std::string& key, const std::string& op, uint64_t seq) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->wait_key = key;
  state_->wait_op = op;
  state_->wait_seq = seq;
  state_->wait_since_ms = now_ms();
}

void ProgressBoard::done_waiting() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->wait_key.clear();
}

void ProgressBoard::publish() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  const uint64_t ticket = ++state_->publishes_asked;
  state_->wake.notify_all();
  state_->wake.wait_for(lock, options_.read_limit, [&] { return state_->publishes_done >= ticket || state_->exited; });
}

ProgressBoard::Report ProgressBoard::describe(const std::string& group_name, const std::vector<int>& members,
                                              const std::string& op, uint64_t seq, std::chrono::milliseconds waited) {
  const std::string key = group_key(group_name, members);
  std::vector<Record> records;
  bool channel_ok = false;
  std::string mine;
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    const uint64_t ticket = ++state_->reads_asked;
    state_->wake.notify_all();
    if (state_->wake.wait_for(lock, options_.read_limit, [&] { return state_->reads_done >= ticket || state_->exited; }) &&
        state_->reads_done >= ticket) {
      records = state_->read_records;
      channel_ok = state_->read_ok;
    }
    mine = state_->serialize_locked();
  }
  records.resize(static_cast<size_t>(world_size_));
  records[size_t(rank_)] = parse_record(mine);
  const int64_t now = now_ms();
  const double stale_after_s = 3.0 * double(options_.publish_every.count()) / 1000.0;

  std::vector<std::string> missing;
  int first_arrived = rank_;
  for (int m : members) {
    const Record& r = records[size_t(m)];
    auto it = r.entered.find(key);
    const uint64_t n = it == r.entered.end() ? 0 : it->second;
    if (n >= seq) {
      first_arrived = std::min(first_arrived, m);
      continue;
    }
    if (!r.present) {
      missing.push_back(strprintf("rank %d (no record on the side channel)", m));
      continue;
    }
    std::string doing = r.wait_key.empty()
                            ? std::string("not in a collective")
                            : strprintf("has waited %.0f s in %s #%llu on group %s",  // worded as the report's head
                                        double(now - r.wait_since_ms) / 1000.0, r.wait_op.c_str(),
                                        (unsigned long long)r.wait_seq, r.wait_key.c_str());
    const double age = double(now - r.published_ms) / 1000.0;
    if (age > stale_after_s) doing += strprintf("; no heartbeat for %.0f s: stopped or dead", age);
    missing.push_back(strprintf("rank %d (last finished iteration %lld; it entered %llu collectives on this group; %s)", m,
                                (long long)r.iteration, (unsigned long long)n, doing.c_str()));
  }
  std::string iterations;
  const int shown = std::min(world_size_, 32);
  for (int r = 0; r < shown; ++r)
    iterations += strprintf("%s%d:%s", r ? " " : "", r,
                            records[size_t(r)].present ? strprintf("%lld", (long long)records[size_t(r)].iteration).c_str()
                                                       : "?");
  if (shown < world_size_) iterations += " ...";

  std::string members_text;
  for (size_t i = 0; i < members.size() && i < 16; ++i) {
    if (i) members_text += ',';
    members_text += std::to_string(members[i]);
  }
  if (members.size() > 16) members_text += ",...";
  std::string who = !channel_ok ? strprintf("the side channel did not answer within %g s, so which ranks have not arrived "
                                            "is unknown; under mpirun rank 0's process hosts it: rank 0 is stopped or dead",
                                            double(options_.read_limit.count()) / 1000.0)
                    : missing.empty() ? "every rank of the group has entered it (the transport itself is stuck: network "
                                        "or NCCL)"
                                      : "not arrived: " + join(missing, ", ");
  Report report;
  report.text = strprintf("collective hang: %s #%llu on group '%s' (global ranks %s) has waited %.0f s on rank %d; %s. "
                          "Last finished iteration per rank: %s. The job ends after --distributed-timeout-minutes "
                          "(%lld min) unless it completes",
                          op.c_str(), (unsigned long long)seq, group_name.c_str(), members_text.c_str(),
                          double(waited.count()) / 1000.0, rank_, who.c_str(), iterations.c_str(),
                          (long long)(options_.hard_limit.count() / 60000));
  report.print = !channel_ok || first_arrived == rank_;
  return report;
}

std::shared_ptr<c10d::Store> make_mpi_side_channel(int rank, int world_size, std::chrono::milliseconds timeout) {
  struct Where {
    char host[256];
    int port;
    int ok;
  } where{};
  std::shared_ptr<c10d::TCPStore> store;
  c10d::TCPStoreOptions options;
  options.waitWorkers = false;
  // Short: a report must not wait long on a store whose host process is stopped.
  options.timeout = std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(10));
  const std::string host = host_name();
  if (rank == 0) {
    try {
      options.port = 0;  // a free port, read back below
      options.isServer = true;
      options.numWorkers = size_t(world_size);
      store = std::make_shared<c10d::TCPStore>(host.empty() ? "localhost" : host, options);
      std::snprintf(where.host, sizeof where.host, "%s", host.c_str());
      where.port = store->getPort();
      where.ok = 1;
    } catch (const std::exception& e) {
      log::warning(std::string("no side channel for hang reports (") + e.what() + ")");
    }
  }
  MPI_Bcast(&where, sizeof where, MPI_BYTE, 0, MPI_COMM_WORLD);
  int ok = where.ok;
  if (ok && rank != 0) {
    try {
      options.port = uint16_t(where.port);
      options.isServer = false;
      const std::string server = host == where.host || where.host[0] == '\0' ? std::string("localhost") : std::string(where.host);
      store = std::make_shared<c10d::TCPStore>(server, options);
    } catch (const std::exception&) {
      ok = 0;
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    if (rank == 0) log::warning("the side channel for hang reports could not be set up: a hung collective is reported only "
                                "when --distributed-timeout-minutes ends the job");
    return nullptr;
  }
  return store;
}

}  // namespace fp8tron
