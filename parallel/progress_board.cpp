#include "parallel/progress_board.h"

#include <mpi.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
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

std::condition_variable& wakeup() {
  static std::condition_variable cv;
  return cv;
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

ProgressBoard::ProgressBoard(std::shared_ptr<c10d::Store> store, int rank, int world_size, Options options)
    : store_(std::move(store)), rank_(rank), world_size_(world_size), options_(options) {
  publish();  // every rank's record exists before the first collective can hang
  thread_ = std::thread([this] { loop(); });
}

ProgressBoard::~ProgressBoard() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wakeup().notify_all();
  if (thread_.joinable()) thread_.join();
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
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last_iteration_ = iteration;
    iteration_changed_ = true;
  }
  wakeup().notify_all();  // published soon (at most every 200 ms), not only at the next second
}

uint64_t ProgressBoard::entered(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return ++entered_[key];
}

void ProgressBoard::waiting(const std::string& key, const std::string& op, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  wait_key_ = key;
  wait_op_ = op;
  wait_seq_ = seq;
  wait_since_ms_ = now_ms();
}

void ProgressBoard::done_waiting() {
  std::lock_guard<std::mutex> lock(mutex_);
  wait_key_.clear();
}

std::string ProgressBoard::serialize() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream os;
  os << "iteration " << last_iteration_ << "\npublished " << now_ms() << "\n";
  if (!wait_key_.empty()) os << "wait " << wait_seq_ << " " << wait_since_ms_ << " " << wait_op_ << " " << wait_key_ << "\n";
  for (const auto& [key, n] : entered_) os << "group " << n << " " << key << "\n";
  return os.str();
}

ProgressBoard::Record ProgressBoard::parse(const std::string& text) {
  Record r;
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

void ProgressBoard::publish() {
  try {
    // Serialized under the store's lock: of two publishes (the background loop's and a direct
    // one), the later write carries the later state, never a stale record over a fresh one.
    std::lock_guard<std::mutex> lock(store_mutex_);
    const std::string text = serialize();
    store_->set(record_key(rank_), std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
    // The side channel is down (e.g. rank 0's process stopped): the next publish retries.
  }
}

void ProgressBoard::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wakeup().wait_for(lock, options_.publish_every, [this] { return stop_ || iteration_changed_; });
    if (stop_) return;
    iteration_changed_ = false;
    lock.unlock();
    publish();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // at most five publishes a second
    lock.lock();
  }
}

ProgressBoard::Report ProgressBoard::describe(const std::string& group_name, const std::vector<int>& members,
                                              const std::string& op, uint64_t seq, std::chrono::milliseconds waited) {
  const std::string key = group_key(group_name, members);
  std::vector<Record> records(static_cast<size_t>(world_size_) + 0);
  bool channel_ok = true;
  try {
    std::lock_guard<std::mutex> lock(store_mutex_);
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_ || !store_->check({record_key(r)})) continue;
      const auto bytes = store_->get(record_key(r));
      records[size_t(r)] = parse(std::string(bytes.begin(), bytes.end()));
    }
  } catch (const std::exception&) {
    channel_ok = false;
  }
  records[size_t(rank_)] = parse(serialize());
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
                            : strprintf("waiting in %s #%llu on group %s for %.0f s", r.wait_op.c_str(),
                                        (unsigned long long)r.wait_seq, r.wait_key.c_str(), double(now - r.wait_since_ms) / 1000.0);
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
  std::string who = missing.empty() ? "every rank of the group has entered it (the transport itself is stuck: network "
                                      "or NCCL)"
                                    : "not arrived: " + join(missing, ", ");
  if (!channel_ok) who += "; the side channel (rank 0's store) does not answer: rank 0's process may be stopped or dead";
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
