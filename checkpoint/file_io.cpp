#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/text.h"
#include "checkpoint/megatron/damage.h"

namespace fp8tron::checkpoint {

namespace {

// Linux transfers at most 0x7ffff000 bytes per write(); stay well under it.
constexpr size_t kMaxWriteChunk = size_t(1) << 30;

std::string parent_dir(const std::string& path) {
  std::filesystem::path p(path);
  std::string parent = p.parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

std::string io_error_message(const char* doing, const std::string& path, int err) {
  switch (err) {
    case ENOSPC:
      return strprintf("disk full (ENOSPC) while %s %s: free space on that file system or "
                       "save to another one", doing, path.c_str());
    case EDQUOT:
      return strprintf("disk quota exceeded (EDQUOT) while %s %s: free space within your quota "
                       "or save to another file system", doing, path.c_str());
    case EIO:
      return strprintf("I/O error (EIO) while %s %s: the storage device or network file system "
                       "reported a failure; check it and retry", doing, path.c_str());
    case EROFS:
      return strprintf("read-only file system while %s %s: save to a writable location",
                       doing, path.c_str());
    case EACCES:
    case EPERM:
      return strprintf("permission denied while %s %s: fix the permissions or save elsewhere",
                       doing, path.c_str());
    default:
      return strprintf("error while %s %s: %s", doing, path.c_str(), std::strerror(err));
  }
}

FileWriter::FileWriter(std::string path, FaultInjection fault, std::string label)
    : path_(std::move(path)), label_(label.empty() ? path_ : std::move(label)), fault_(fault) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw UserError(io_error_message("creating", label_, errno));
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) discard();
}

void FileWriter::fail(const char* doing, int err) {
  discard();
  throw UserError(io_error_message(doing, label_, err));
}

void FileWriter::write(const void* data, size_t n) {
  FP8TRON_CHECK(fd_ >= 0, "write after close: " + path_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    size_t chunk = std::min(n, kMaxWriteChunk);
    bool inject = false;
    if (fault_.fail_after_bytes >= 0) {
      uint64_t limit = uint64_t(fault_.fail_after_bytes);
      uint64_t room = limit > written_ ? limit - written_ : 0;
      if (room < chunk) {
        chunk = size_t(room);
        inject = true;
      }
    }
    if (chunk > 0) {
      ssize_t w = ::write(fd_, p, chunk);
      if (w < 0) {
        if (errno == EINTR) continue;
        fail("writing", errno);
      }
      // A short write means the device ran out of room part-way; the next call reports why.
      p += w;
      n -= size_t(w);
      written_ += uint64_t(w);
      if (size_t(w) < chunk) continue;
    }
    if (inject) fail("writing", fault_.error);
  }
}

void FileWriter::reserve(uint64_t bytes) {
  if (bytes == 0) return;
  if (fault_.fail_after_bytes >= 0 && bytes > uint64_t(fault_.fail_after_bytes)) {
    // Tests use fault injection to exercise the mid-write path; let it happen there.
    return;
  }
  if (::fallocate(fd_, 0, 0, off_t(bytes)) != 0) {
    int err = errno;
    if (err == ENOSPC || err == EDQUOT || err == EIO) fail("reserving space for", err);
    // EOPNOTSUPP, ENOSYS, EINVAL (some network file systems): no early warning, carry on.
  }
}

void FileWriter::start_writeback(uint64_t offset, uint64_t n) {
  // Best effort: an error here is reported again by the final fsync.
  (void)::sync_file_range(fd_, off_t(offset), off_t(n), SYNC_FILE_RANGE_WRITE);
}

void FileWriter::sync() {
  if (::fsync(fd_) != 0) fail("syncing", errno);
}

void FileWriter::close() {
  if (fd_ < 0) return;
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && errno != EINTR) {
    int err = errno;
    ::unlink(path_.c_str());
    throw UserError(io_error_message("closing", label_, err));
  }
}

void FileWriter::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  ::unlink(path_.c_str());
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError(io_error_message("opening (to sync)", path, errno));
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    // Some file systems cannot fsync a directory; the data is as durable as they make it.
    if (err == EINVAL || err == EBADF) return;
    throw UserError(io_error_message("syncing", path, err));
  }
  ::close(fd);
}

void write_file_atomically(const std::string& path, const std::string& contents,
                           const FaultInjection& fault) {
  std::string tmp = strprintf("%s.tmp.%d", path.c_str(), int(::getpid()));
  {
    FileWriter w(tmp, fault, path);
    w.write(contents.data(), contents.size());
    w.sync();
    w.close();
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw UserError(io_error_message("renaming into place", path, err));
  }
  fsync_path(parent_dir(path));
}

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DamagedCheckpoint(read_error_message("opening", path, errno));
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw DamagedCheckpoint(read_error_message("reading", path, err));
    }
    if (r == 0) break;
    out.append(buf, size_t(r));
  }
  ::close(fd);
  return out;
}

namespace {
int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (::remove(path) != 0 && errno != ENOENT) return 1;
  return 0;
}
}  // namespace

bool remove_tree(const std::string& path) noexcept {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  if (!S_ISDIR(st.st_mode)) return ::unlink(path.c_str()) == 0 || errno == ENOENT;
  // Depth first (children before their directory), not following symlinks or crossing mounts.
  return ::nftw(path.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) == 0;
}

}  // namespace fp8tron::checkpoint
