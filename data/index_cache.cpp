#include "data/index_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::data {
namespace {

bool is_complete(const CacheEntry& entry) {
  std::ifstream in(entry.path("description.txt"), std::ios::binary);
  if (!in) return false;
  std::stringstream stored;
  stored << in.rdbuf();
  if (stored.str() != entry.description) return false;
  for (const auto& suffix : entry.suffixes)
    if (!std::filesystem::exists(entry.path(suffix))) return false;
  return true;
}

std::string temp_suffix() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return strprintf(".tmp.%s.%d", host, int(::getpid()));
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw UserError(strprintf("cannot write %s", path.c_str()));
}

void build_and_publish(const CacheEntry& entry, const std::function<void(const std::vector<std::string>&)>& build) {
  const std::string tmp = temp_suffix();
  std::vector<std::string> temps;
  for (const auto& suffix : entry.suffixes) temps.push_back(entry.path(suffix) + tmp);
  try {
    build(temps);
    write_text(entry.path("description.txt") + tmp, entry.description);
  } catch (...) {
    for (const auto& t : temps) std::remove(t.c_str());
    std::remove((entry.path("description.txt") + tmp).c_str());
    throw;
  }
  for (size_t i = 0; i < temps.size(); ++i) std::filesystem::rename(temps[i], entry.path(entry.suffixes[i]));
  std::filesystem::rename(entry.path("description.txt") + tmp, entry.path("description.txt"));
}

// An exclusive flock held for the lifetime of the object; `held` is false where the file system
// does not support flock.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0)
      throw UserError(strprintf("cannot create the lock file %s: %s (pass --data-cache-path with a writable "
                                "directory)", path.c_str(), std::strerror(errno)));
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) { held = true; return; }
    if (errno == EWOULDBLOCK) {
      std::fprintf(stderr, "waiting for another process to build the dataset indices (lock %s)\n", path.c_str());
      int rc;
      while ((rc = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {}
      held = rc == 0;
    }
  }
  ~FileLock() {
    if (held) ::flock(fd_, LOCK_UN);
    if (fd_ >= 0) ::close(fd_);
  }
  bool held = false;

 private:
  int fd_ = -1;
};

}  // namespace

bool ensure_cached(const CacheEntry& entry, const std::function<void(const std::vector<std::string>&)>& build) {
  if (is_complete(entry)) return false;
  std::error_code ec;
  std::filesystem::create_directories(entry.dir, ec);
  if (ec)
    throw UserError(strprintf("cannot create the dataset index cache directory %s: %s (pass --data-cache-path "
                              "with a writable directory)", entry.dir.c_str(), ec.message().c_str()));
  FileLock lock(entry.dir + "/" + entry.base + ".lock");
  if (is_complete(entry)) return false;  // built by whoever held the lock before us
  build_and_publish(entry, build);
  return true;
}

std::string hash_hex(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return strprintf("%016llx", (unsigned long long)h);
}

}  // namespace fp8tron::data
