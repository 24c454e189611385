// One job per save directory. Two jobs saving into one --save overwrite each other's checkpoints
// and tracker; the first to start holds <save>/fp8tron.lock, a second is refused with one line
// naming the owner (host, pid, start time).
//
// The lock is an flock on that file, which the kernel drops when its process ends, however it
// ends (kill -9 included), so a crashed job's lock is taken over by the next one. On a file system
// without flock the file's contents decide: a lock left by a process that no longer exists on this
// host is stale and taken over; one from another host is refused (delete the file once that job is
// known to be gone). A job ends by emptying the file. Torch-free.
#pragma once
#include <memory>
#include <string>

namespace fp8tron::checkpoint {

inline constexpr const char* kLockFileName = "fp8tron.lock";

class SaveDirLock {
 public:
  // Creates `dir` if needed and takes its lock; UserError when another job holds it.
  static std::unique_ptr<SaveDirLock> acquire(const std::string& dir);
  ~SaveDirLock();  // releases it
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;

  const std::string& path() const { return path_; }
  // The previous owner whose stale lock was taken over ("" when the lock was free).
  const std::string& taken_over() const { return taken_over_; }

 private:
  SaveDirLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  std::string taken_over_;
};

// "host=<name> pid=<pid> started=<UTC time>": what a lock file holds.
std::string lock_owner_text();

}  // namespace fp8tron::checkpoint
