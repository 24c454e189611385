// Weights & Biases logging for --wandb-project. The wandb client is Python; the trainer is not, so
// the W&B run lives in a side process (trainer/logging/wandb_logger.py) that this writer starts
// and feeds over a pipe, one JSON line per scalar. The training loop never waits for it: log()
// only queues the line, and a background thread writes the queue into the pipe. A logger that
// dies, or falls too far behind, loses records with one warning; training goes on.
#pragma once
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace fp8tron {

// How the logger is started: `python script --status-fd 3`.
struct WandbLoggerCommand {
  std::string python;  // a path, or a name looked up in PATH
  std::string script;  // wandb_logger.py
};

class WandbWriter {
 public:
  // Starts the logger, hands it `init` (one JSON object: project, name, entity, dir, config,
  // trainer_pid, program, args) and waits until wandb.init has returned, at most `start_timeout`.
  // Throws UserError, one line naming the fix, when the interpreter cannot be run, has no wandb
  // package, or wandb.init fails.
  WandbWriter(const WandbLoggerCommand& command, const std::string& init, std::chrono::seconds start_timeout);
  // Without finish(): the run is closed as failed (exit code 1), as when Python dies on an error.
  ~WandbWriter();
  WandbWriter(const WandbWriter&) = delete;
  WandbWriter& operator=(const WandbWriter&) = delete;

  // One scalar of iteration `step` (Megatron's wandb_writer.log({name: value}, step)). Never
  // blocks: the line is queued, or dropped while the logger is dead or too far behind.
  void log(const std::string& name, double value, int64_t step);

  // Queues the end of the run with `exit_code`, then waits up to `timeout` for the queue to drain
  // and the logger to close the run (wandb finish; online it uploads what is left). A logger still
  // busy then is left to finish on its own.
  void finish(int exit_code, std::chrono::seconds timeout);

  const std::string& run_dir() const { return run_dir_; }  // where wandb writes the run
  pid_t pid() const { return pid_; }
  int64_t dropped() const { return dropped_; }

  // The most bytes of lines the queue holds before records are dropped.
  static constexpr size_t kQueueLimitBytes = 16u << 20;

 private:
  void spawn(const WandbLoggerCommand& command);
  std::string await_answer(std::chrono::seconds timeout);
  void enqueue(std::string line);
  enum class WriteResult { kWritten, kLoggerGone, kGaveUp };
  void write_queue();  // the background thread
  // kGaveUp: finish's timeout passed while the logger was not reading.
  WriteResult write_all(const std::string& bytes);
  // Whether the logger has exited by `deadline` (collecting its status).
  bool reap(std::chrono::steady_clock::time_point deadline);
  bool exited_with_failure();
  void warn_once_dead();
  void shut_down(std::chrono::seconds timeout);
  std::string exit_description();

  std::string python_;
  pid_t pid_ = -1;
  std::mutex reap_mutex_;  // guards exited_ and exit_status_
  bool exited_ = false;
  int exit_status_ = 0;  // waitpid's status; -1: exited, status unknown
  int input_fd_ = -1;   // the logger's stdin (non-blocking)
  int status_fd_ = -1;  // its start-up answer
  std::string run_dir_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::string> queue_;
  size_t queued_bytes_ = 0;
  bool closing_ = false;  // no more lines come: drain the queue, then stop
  std::chrono::steady_clock::time_point give_up_at_ = std::chrono::steady_clock::time_point::max();
  std::thread thread_;

  std::atomic<bool> dead_{false};     // the logger is gone: records are dropped
  std::atomic<bool> gave_up_{false};  // finish stopped waiting for a logger that did not read
  std::atomic<int64_t> dropped_{0};
  bool finished_ = false;
  bool warned_dead_ = false;
  bool warned_behind_ = false;
  int64_t last_step_ = 0;
};

}  // namespace fp8tron
