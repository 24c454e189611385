// Durable file writing for checkpoints: large unbuffered writes with errno turned into one-line
// UserErrors that name the file ("disk full while writing ..."), fsync of files and directories,
// and write-to-temp + rename for small files. Every write goes through FileWriter so tests can
// inject a failure ("fail after N bytes with ENOSPC") without a full disk.
#pragma once
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>

namespace fp8tron::checkpoint {

// Test hook: the writer fails with `error` (an errno value) once `fail_after_bytes` bytes have
// been written to the file; the bytes before that point are really written. -1 = never.
struct FaultInjection {
  int64_t fail_after_bytes = -1;
  int error = ENOSPC;
};

// An open file being written. Not buffered: callers hand it large blocks. On any failure it
// closes the descriptor, removes the file and throws UserError; a FileWriter destroyed before
// close() also removes its file, so nothing half-written stays behind under the target name.
class FileWriter {
 public:
  // Creates (or truncates) `path`, mode 0644. Errors name `label` (default: the path), e.g. the
  // final name of a file written under a temporary one.
  explicit FileWriter(std::string path, FaultInjection fault = {}, std::string label = {});
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  ~FileWriter();

  void write(const void* data, size_t n);
  // Reserves `bytes` on disk (fallocate) so a full disk shows up before any data is written;
  // file systems without fallocate are skipped silently (it is only an early warning).
  void reserve(uint64_t bytes);
  // Asks the kernel to start writing back [offset, offset + n) now (sync_file_range), so the
  // final fsync does not find gigabytes of dirty pages.
  void start_writeback(uint64_t offset, uint64_t n);
  void sync();
  // Closes the file (close errors such as deferred EIO are reported). The file stays.
  void close();
  // Closes and removes the file; never throws.
  void discard() noexcept;

  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return written_; }

 private:
  [[noreturn]] void fail(const char* doing, int err);

  std::string path_;
  std::string label_;
  FaultInjection fault_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

// "disk full (ENOSPC) while writing <path>: ..." and friends: one line, no trailing period.
std::string io_error_message(const char* doing, const std::string& path, int err);

// fsync a file or a directory by path (directories: makes renames and creations in it durable).
void fsync_path(const std::string& path);

// Writes `contents` to `path` durably and atomically: <path>.tmp.<pid> + fsync + rename +
// fsync of the parent directory. A crash leaves either the old file or the new one.
void write_file_atomically(const std::string& path, const std::string& contents,
                           const FaultInjection& fault = {});

// The whole file as a string; UserError naming the file when it cannot be read.
std::string read_file(const std::string& path);

// Removes `path` and, for a directory, everything under it (symlinks are removed, not followed).
// Best effort: returns false when something could not be removed; never throws. Use this, not
// std::filesystem::remove_all: libtorch exports its own remove_all, built against a newer
// libstdc++, and in a binary linked with libtorch that one is called and crashes on GCC 12.
bool remove_tree(const std::string& path) noexcept;

}  // namespace fp8tron::checkpoint
