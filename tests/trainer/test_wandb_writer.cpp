// The W&B writer against stand-in loggers (shell scripts in place of wandb_logger.py): what it
// sends, the one-line start-up errors, and that neither a dead nor a stalled logger ever makes the
// caller wait or fail.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/checkpoint/temp_dir.h"
#include "trainer/logging/wandb_writer.h"

namespace fp8tron {
namespace {

using checkpoint::testing::slurp;
using checkpoint::testing::spit;
using checkpoint::testing::TempDir;
using Clock = std::chrono::steady_clock;

// A logger that answers `answer` on the status descriptor, then runs `then`.
WandbLoggerCommand fake_logger(const TempDir& dir, const std::string& answer, const std::string& then) {
  spit(dir / "logger.sh", "echo '" + answer + "' >&3\nexec 3>&-\n" + then + "\n");
  return {"/bin/sh", dir / "logger.sh"};
}

// The message of the UserError that starting the writer throws ("" if it starts).
std::string start_error(const WandbLoggerCommand& command) {
  try {
    WandbWriter writer(command, "{}", std::chrono::seconds(20));
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(WandbWriter, SendsTheStartRecordsAndTheEnd) {
  TempDir dir;
  {
    WandbWriter writer(fake_logger(dir, "ready /runs/offline-run-1", "cat >" + (dir / "received")), "{\"project\":\"p\"}",
                       std::chrono::seconds(20));
    EXPECT_EQ(writer.run_dir(), "/runs/offline-run-1");
    writer.log("lm loss", 2.5, 1);
    writer.log("grad-norm", std::nan(""), 1);
    writer.log("loss-scale", INFINITY, 2);
    writer.log("a \"quoted\" name", 0.1, 3);
    writer.finish(0, std::chrono::seconds(20));
    EXPECT_EQ(writer.dropped(), 0);
  }
  EXPECT_EQ(slurp(dir / "received"),
            "{\"project\":\"p\"}\n"
            "{\"step\":1,\"name\":\"lm loss\",\"value\":2.5}\n"
            "{\"step\":1,\"name\":\"grad-norm\",\"value\":NaN}\n"
            "{\"step\":2,\"name\":\"loss-scale\",\"value\":Infinity}\n"
            "{\"step\":3,\"name\":\"a \\\"quoted\\\" name\",\"value\":0.10000000000000001}\n"
            "{\"finish\":0}\n");
}

TEST(WandbWriter, WithoutFinishTheRunEndsAsFailed) {
  TempDir dir;
  { WandbWriter writer(fake_logger(dir, "ready /runs/r", "cat >" + (dir / "received")), "{}", std::chrono::seconds(20)); }
  EXPECT_EQ(slurp(dir / "received"), "{}\n{\"finish\":1}\n");
}

TEST(WandbWriter, StartErrorsAreOneLineNamingTheFix) {
  TempDir dir;
  const std::string missing = start_error({dir / "no-such-python", dir / "wandb_logger.py"});
  EXPECT_NE(missing.find("cannot be run"), std::string::npos) << missing;
  const std::string no_wandb = start_error(fake_logger(dir, "error wandb-missing: No module named 'wandb'", "exit 1"));
  EXPECT_NE(no_wandb.find("the wandb package is not installed for /bin/sh"), std::string::npos) << no_wandb;
  const std::string init = start_error(fake_logger(dir, "error wandb.init: UsageError: api_key not configured", "exit 1"));
  EXPECT_EQ(init, "--wandb-project: wandb.init failed: UsageError: api_key not configured");
  const std::string died = start_error({"/bin/sh", "-c"});  // sh -c --status-fd: fails before answering
  EXPECT_NE(died.find("before starting the run"), std::string::npos) << died;
  for (const std::string& e : {missing, no_wandb, died}) {
    EXPECT_NE(e.find("scripts/setup.sh"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

TEST(WandbWriter, ADeadLoggerLosesRecordsWithOneWarning) {
  TempDir dir;
  WandbWriter writer(fake_logger(dir, "ready /runs/r", "exit 3"), "{}", std::chrono::seconds(20));
  ::testing::internal::CaptureStderr();
  const auto start = Clock::now();
  // Until the writer has seen the logger gone (a write finds the pipe closed), then some more.
  for (int64_t step = 1; writer.dropped() < 100 && Clock::now() - start < std::chrono::seconds(20); ++step) {
    writer.log("lm loss", 1.0, step);
    if (writer.dropped() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  writer.finish(0, std::chrono::seconds(5));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_GE(writer.dropped(), 100);
  EXPECT_EQ(count(err, "WARNING"), 1u) << err;
  EXPECT_NE(err.find("exited with status 3"), std::string::npos) << err;
  EXPECT_NE(err.find("training goes on"), std::string::npos) << err;
}

TEST(WandbWriter, AStalledLoggerNeverBlocksTheCaller) {
  TempDir dir;
  // Answers, then never reads: the pipe fills, then the queue.
  WandbWriter writer(fake_logger(dir, "ready /runs/r", "exec sleep 60"), "{}", std::chrono::seconds(20));
  ::testing::internal::CaptureStderr();
  const int64_t records = int64_t(WandbWriter::kQueueLimitBytes / 40) + 100000;
  auto start = Clock::now();
  for (int64_t step = 0; step < records; ++step) writer.log("lm loss", 1.0, step);
  const double logging_s = std::chrono::duration<double>(Clock::now() - start).count();
  start = Clock::now();
  writer.finish(0, std::chrono::seconds(1));
  const double finish_s = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string err = ::testing::internal::GetCapturedStderr();
  kill(writer.pid(), SIGKILL);  // the stand-in would sleep on
  waitpid(writer.pid(), nullptr, 0);
  EXPECT_LT(logging_s, 10.0) << records << " records";
  EXPECT_LT(finish_s, 3.0);
  EXPECT_GT(writer.dropped(), 0);
  EXPECT_EQ(count(err, "is falling behind"), 1u) << err;
  EXPECT_EQ(count(err, "did not take the run's last records"), 1u) << err;
}

}  // namespace
}  // namespace fp8tron
