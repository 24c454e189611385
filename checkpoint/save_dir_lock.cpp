#include "checkpoint/save_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <ctime>
#include <filesystem>

#include "core/error.h"
#include "core/text.h"
#include "checkpoint/file_io.h"

namespace fp8tron::checkpoint {
namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

std::string contents_of(int fd) {
  std::string out;
  char buffer[512];
  ssize_t n = 0;
  off_t at = 0;
  while ((n = ::pread(fd, buffer, sizeof buffer, at)) > 0 && out.size() < 4096) {
    out.append(buffer, size_t(n));
    at += n;
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// The value of `key=` in a lock file's text ("" when absent).
std::string field(const std::string& text, const std::string& key) {
  const size_t at = text.find(key + "=");
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 1, end = text.find(' ', begin);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// Whether the owner recorded in `text` may still be running: another host, or a live pid here.
bool owner_may_be_alive(const std::string& text) {
  if (field(text, "host") != host_name()) return true;
  const long pid = std::strtol(field(text, "pid").c_str(), nullptr, 10);
  if (pid <= 0) return false;
  return ::kill(pid_t(pid), 0) == 0 || errno == EPERM;
}

[[noreturn]] void refuse(const std::string& dir, const std::string& path, const std::string& owner, bool flock_held) {
  throw UserError(strprintf("--save %s is in use by another fp8tron job (%s, holding %s)%s; two jobs saving into one "
                            "directory overwrite each other's checkpoints: give this job its own --save, or stop the "
                            "other one first",
                            dir.c_str(), owner.empty() ? "owner unknown" : owner.c_str(), path.c_str(),
                            flock_held ? "" : " (this file system has no flock: delete the file if that job is gone)"));
}

}  // namespace

std::string lock_owner_text() {
  char started[64] = {};
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return strprintf("host=%s pid=%ld started=%s", host_name().c_str(), long(::getpid()), started);
}

std::unique_ptr<SaveDirLock> SaveDirLock::acquire(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (std::filesystem::path(dir) / kLockFileName).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(io_error_message("opening the lock file", path, errno));
  std::string previous;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    previous = contents_of(fd);
    if (err == EWOULDBLOCK) {
      ::close(fd);
      refuse(dir, path, previous, true);
    }
    // No flock here (e.g. some network file systems): the recorded owner decides.
    if (!previous.empty() && owner_may_be_alive(previous)) {
      ::close(fd);
      refuse(dir, path, previous, false);
    }
  } else {
    previous = contents_of(fd);  // a crashed job's: the kernel released its flock
  }
  std::unique_ptr<SaveDirLock> lock(new SaveDirLock(path, fd));
  lock->taken_over_ = previous;
  const std::string text = lock_owner_text() + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != ssize_t(text.size()) || ::fsync(fd) != 0)
    throw UserError(io_error_message("writing the lock file", path, errno));
  return lock;
}

SaveDirLock::~SaveDirLock() {
  if (fd_ < 0) return;
  // Emptied, not removed: removing a locked file lets a job that opened it meanwhile lock an
  // unlinked file while a third creates and locks a new one.
  if (::ftruncate(fd_, 0) == 0) ::fsync(fd_);
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

}  // namespace fp8tron::checkpoint
