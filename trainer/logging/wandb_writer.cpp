#include "trainer/logging/wandb_writer.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"

extern char** environ;

namespace fp8tron {
namespace {

using Clock = std::chrono::steady_clock;

// The descriptor the logger answers on (wandb_logger.py --status-fd).
constexpr int kStatusFd = 3;

// A pipe whose ends are close-on-exec and numbered above the child's stdin..status descriptors,
// so that the spawn's dup2 onto 0 and kStatusFd always copies (and so clears close-on-exec).
void make_pipe(int fds[2]) {
  int raw[2];
  if (pipe2(raw, O_CLOEXEC) != 0) throw UserError(std::string("--wandb-project: cannot create a pipe: ") + std::strerror(errno));
  for (int i = 0; i < 2; ++i) {
    fds[i] = fcntl(raw[i], F_DUPFD_CLOEXEC, kStatusFd + 1);
    close(raw[i]);
  }
}

// JSON has no NaN or infinities; Python's json reads these tokens, and W&B logs the values.
std::string json_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return strprintf("%.17g", v);
}

// `runs`: whether `python` could be started (then pip can install wandb for it).
std::string setup_hint(const std::string& python, bool runs = true) {
  const std::string pip = runs ? "`" + python + " -m pip install wandb`, or " : "";
  return "run scripts/setup.sh (it installs wandb into the project's .venv), or " + pip +
         "point FP8TRON_WANDB_PYTHON at a Python that has it";
}

}  // namespace

WandbWriter::WandbWriter(const WandbLoggerCommand& command, const std::string& init, std::chrono::seconds start_timeout)
    : python_(command.python) {
  spawn(command);
  thread_ = std::thread([this] { write_queue(); });
  enqueue(init + "\n");
  try {
    const std::string answer = await_answer(start_timeout);
    if (answer.rfind("ready ", 0) == 0) {
      run_dir_ = answer.substr(6);
    } else if (answer.rfind("error wandb-missing", 0) == 0) {
      throw UserError("--wandb-project: the wandb package is not installed for " + python_ + "; " + setup_hint(python_));
    } else if (answer.rfind("error wandb.init: ", 0) == 0) {
      throw UserError("--wandb-project: wandb.init failed: " + answer.substr(18));
    } else {
      throw UserError("--wandb-project: the W&B logger (" + python_ + " " + command.script + ") " + exit_description() +
                      " before starting the run (its messages are above); " + setup_hint(python_));
    }
  } catch (...) {
    if (!reap(Clock::now())) kill(pid_, SIGKILL);  // ours, and of no use without a run
    shut_down(std::chrono::seconds(5));
    throw;
  }
}

WandbWriter::~WandbWriter() {
  if (!finished_) finish(1, std::chrono::seconds(30));
}

void WandbWriter::spawn(const WandbLoggerCommand& command) {
  int input[2], status[2];
  make_pipe(input);
  make_pipe(status);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, input[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, status[1], kStatusFd);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // Its own process group: a terminal's Ctrl-C goes to the trainer, which then closes the run.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  const std::string fd = std::to_string(kStatusFd);
  const char* argv[] = {command.python.c_str(), command.script.c_str(), "--status-fd", fd.c_str(), nullptr};
  const int rc = posix_spawnp(&pid_, command.python.c_str(), &actions, &attributes, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  close(input[0]);
  close(status[1]);
  if (rc != 0) {
    close(input[1]);
    close(status[0]);
    throw UserError("--wandb-project: W&B logging needs Python with the wandb package, and " + command.python +
                    " cannot be run (" + std::strerror(rc) + "); " + setup_hint(command.python, false));
  }
  input_fd_ = input[1];
  status_fd_ = status[0];
  fcntl(input_fd_, F_SETFL, fcntl(input_fd_, F_GETFL) | O_NONBLOCK);
}

// The logger's one line on the status descriptor ("" when it closed it without answering).
std::string WandbWriter::await_answer(std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string text;
  for (;;) {
    if (const size_t end = text.find('\n'); end != std::string::npos) return text.substr(0, end);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0)
      throw UserError(strprintf("--wandb-project: the W&B logger did not start the run within %lld s (wandb.init; its "
                                "messages are above)",
                                (long long)timeout.count()));
    pollfd p{status_fd_, POLLIN, 0};
    if (poll(&p, 1, int(std::min<int64_t>(left, 1000))) <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(status_fd_, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      reap(Clock::now() + std::chrono::seconds(5));
      return "";
    }
    text.append(buffer, size_t(n));
  }
}

void WandbWriter::log(const std::string& name, double value, int64_t step) {
  last_step_ = step;
  if (dead_) {
    ++dropped_;
    warn_once_dead();
    return;
  }
  enqueue("{\"step\":" + std::to_string(step) + ",\"name\":" + nlohmann::json(name).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
          ",\"value\":" + json_number(value) + "}\n");
}

void WandbWriter::enqueue(std::string line) {
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    full = queued_bytes_ + line.size() > kQueueLimitBytes;
    if (!full) {
      queued_bytes_ += line.size();
      queue_.push_back(std::move(line));
    }
  }
  if (full) {
    ++dropped_;
    if (!warned_behind_)
      log::warning(strprintf("W&B: the logger process (pid %d) is falling behind; records are dropped until it catches "
                             "up (training goes on)",
                             int(pid_)));
    warned_behind_ = true;
    return;
  }
  wake_.notify_one();
}

// The background thread: the queue into the pipe, until the logger is gone or the writer closes.
void WandbWriter::write_queue() {
  // A write into a pipe nobody reads raises SIGPIPE in the writing thread, and its default action
  // ends the process: blocked here, the write fails with EPIPE instead.
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return !queue_.empty() || closing_; });
    if (queue_.empty()) return;
    std::string batch;
    int64_t lines = 0;
    while (!queue_.empty() && batch.size() < (64u << 10)) {
      batch += queue_.front();
      queued_bytes_ -= queue_.front().size();
      queue_.pop_front();
      ++lines;
    }
    lock.unlock();
    const WriteResult result = write_all(batch);
    // A logger gone is reaped here, off the training loop, so that the warning can say how it ended.
    if (result == WriteResult::kLoggerGone) reap(Clock::now() + std::chrono::seconds(2));
    lock.lock();
    if (result != WriteResult::kWritten) {
      dropped_ += lines + int64_t(queue_.size());
      queue_.clear();
      queued_bytes_ = 0;
      (result == WriteResult::kGaveUp ? gave_up_ : dead_) = true;
      return;
    }
  }
}

WandbWriter::WriteResult WandbWriter::write_all(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(input_fd_, bytes.data() + done, bytes.size() - done);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) return WriteResult::kLoggerGone;  // EPIPE: the logger has exited
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (Clock::now() >= give_up_at_) return WriteResult::kGaveUp;
    }
    pollfd p{input_fd_, POLLOUT, 0};
    poll(&p, 1, 100);
  }
  return WriteResult::kWritten;
}

// Either thread may reap; the lock is held only around each non-blocking look.
bool WandbWriter::reap(Clock::time_point deadline) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(reap_mutex_);
      if (exited_) return true;
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {  // ECHILD: reaped by the system (SIGCHLD ignored)
        exited_ = true;
        exit_status_ = r == pid_ ? status : -1;
        return true;
      }
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string WandbWriter::exit_description() {
  reap(Clock::now());
  std::lock_guard<std::mutex> lock(reap_mutex_);
  if (!exited_) return "stopped reading its input";
  if (exit_status_ < 0) return "has exited";
  if (WIFSIGNALED(exit_status_))
    return strprintf("was killed by signal %d (%s)", WTERMSIG(exit_status_), strsignal(WTERMSIG(exit_status_)));
  return strprintf("exited with status %d", WEXITSTATUS(exit_status_));
}

bool WandbWriter::exited_with_failure() {
  std::lock_guard<std::mutex> lock(reap_mutex_);
  return exited_ && exit_status_ > 0;
}

void WandbWriter::warn_once_dead() {
  if (warned_dead_) return;
  warned_dead_ = true;
  log::warning(strprintf("W&B logging stopped after iteration %lld: the logger process (pid %d) %s; the rest of the run "
                         "is not logged to W&B (training goes on)",
                         (long long)last_step_, int(pid_), exit_description().c_str()));
}

void WandbWriter::finish(int exit_code, std::chrono::seconds timeout) {
  if (finished_) return;
  finished_ = true;
  if (!dead_) enqueue(strprintf("{\"finish\":%d}\n", exit_code));
  shut_down(timeout);
  if (gave_up_)
    log::warning(strprintf("W&B: the logger process (pid %d) did not take the run's last records within %lld s; %lld "
                           "records were not logged",
                           int(pid_), (long long)timeout.count(), (long long)dropped_));
  else if (dead_)
    warn_once_dead();
  else if (exited_with_failure())
    log::warning("W&B: the logger process " + exit_description() + " while closing the run (its messages are above)");
}

// Drains the queue (until `timeout`), closes the logger's input and waits for it to exit.
void WandbWriter::shut_down(std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
    give_up_at_ = deadline;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
  if (input_fd_ >= 0) close(input_fd_);
  if (status_fd_ >= 0) close(status_fd_);
  input_fd_ = status_fd_ = -1;
  if (pid_ > 0 && !reap(deadline))
    log::warning(strprintf("W&B: the logger process (pid %d) is still closing the run after %lld s; it finishes on its own",
                           int(pid_), (long long)timeout.count()));
}

}  // namespace fp8tron
