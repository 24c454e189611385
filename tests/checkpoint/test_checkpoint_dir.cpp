// Megatron layout, tracker parsing and the atomic commit: a crash simulated after every commit
// step (the hook throws) must leave the tracker naming a complete, loadable checkpoint; a full
// disk must give a clear error and keep the previous checkpoint.
#include "checkpoint/checkpoint_dir.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <functional>
#include <thread>

#include "core/error.h"
#include "tests/checkpoint/temp_dir.h"
#include "checkpoint/safetensors.h"
#include "tests/checkpoint/error_text.h"
#include "checkpoint/megatron/damage.h"
#include "checkpoint/other_iterations.h"

namespace fp8tron::checkpoint {
namespace {

using testing::error_of;

namespace fs = std::filesystem;
using testing::slurp;
using testing::spit;
using testing::TempDir;

struct SimulatedCrash {
  CommitStep step;
};

constexpr int kRanks = 3;

std::vector<std::string> expected_files() {
  return {"rank_0.safetensors", "rank_1.safetensors", "rank_2.safetensors", "info.txt"};
}

// A toy checkpoint: each rank stores {iteration, rank, generation}; info.txt repeats them.
// `generation` tells two saves of the same iteration apart.
void save(const std::string& dir, int64_t iteration, const std::string& token, int64_t generation,
          std::optional<CommitStep> crash_at = std::nullopt, FaultInjection rank1_fault = {},
          bool release = false) {
  SaveTarget target{dir, iteration, release, token};
  std::string tmp = begin_save(target);
  for (int r = 0; r < kRanks; ++r) {
    int64_t value[3] = {iteration, r, generation};
    WriteOptions opt;
    if (r == 1) opt.fault = rank1_fault;
    write_safetensors(tmp + "/rank_" + std::to_string(r) + ".safetensors",
                      {{"value", DType::I64, {3}, value, {}}}, {}, opt);
  }
  write_file_atomically(tmp + "/info.txt", std::to_string(iteration) + " " + std::to_string(generation));
  CommitOptions opts;
  opts.expected_files = expected_files();
  opts.expected_file_count = kRanks + 1;
  if (crash_at)
    opts.hook = [&](CommitStep s) {
      if (s == *crash_at) throw SimulatedCrash{s};
    };
  commit_save(target, opts);
}

struct Loaded {
  int64_t iteration;
  int64_t generation;
};

// Loads what the tracker names and checks it is complete and self-consistent.
Loaded load(const std::string& dir) {
  CheckpointLocation loc = locate_latest_checkpoint(dir);
  std::vector<std::string> files = list_checkpoint_files(loc);
  auto want = expected_files();
  std::sort(want.begin(), want.end());
  EXPECT_EQ(files, want) << loc.path;
  int64_t generation = -1;
  for (int r = 0; r < kRanks; ++r) {
    auto f = SafetensorsFile::open(loc.path + "/rank_" + std::to_string(r) + ".safetensors");
    const auto* v = reinterpret_cast<const int64_t*>(f.at("value").data);
    EXPECT_EQ(v[0], loc.iteration);
    EXPECT_EQ(v[1], r);
    if (r == 0) generation = v[2];
    EXPECT_EQ(v[2], generation) << "files of different saves mixed in " << loc.path;
  }
  EXPECT_EQ(slurp(loc.path + "/info.txt"), std::to_string(loc.iteration) + " " + std::to_string(generation));
  return {loc.iteration, generation};
}

// Names in `dir` other than committed checkpoints and the tracker.
std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    bool committed = n == kTrackerFileName || n == "release" ||
                     (n.rfind("iter_", 0) == 0 && n.find('.') == std::string::npos);
    if (!committed) out.push_back(n);
  }
  return out;
}

TEST(CheckpointDir, RemoveTreeRemovesEverythingAndFollowsNoLinks) {
  TempDir dir;
  const std::string outside = dir / "outside";
  fs::create_directories(outside);
  spit(outside + "/keep", "x");
  const std::string tree = dir / "tree";
  fs::create_directories(tree + "/a/b");
  spit(tree + "/a/b/file", "y");
  spit(tree + "/top", "z");
  fs::create_directory_symlink(outside, tree + "/a/link");
  EXPECT_TRUE(remove_tree(tree));
  EXPECT_FALSE(fs::exists(tree));
  EXPECT_TRUE(fs::exists(outside + "/keep")) << "a symlinked directory's contents stay";
  EXPECT_TRUE(remove_tree(tree)) << "a missing path is already removed";
  EXPECT_TRUE(remove_tree(outside + "/keep"));
  EXPECT_FALSE(fs::exists(outside + "/keep"));
}

TEST(CheckpointDir, MegatronNames) {
  EXPECT_EQ(checkpoint_dir_name(100), "iter_0000100");
  EXPECT_EQ(checkpoint_dir_name(0), "iter_0000000");
  EXPECT_EQ(checkpoint_dir_name(12345678), "iter_12345678");
  EXPECT_EQ(checkpoint_dir_name(5, true), "release");
  SaveTarget t{"/ckpt", 100, false, "abc"};
  EXPECT_EQ(temp_dir_path(t), "/ckpt/iter_0000100.tmp.abc");
  EXPECT_EQ(final_dir_path(t), "/ckpt/iter_0000100");
  EXPECT_EQ(std::string(kTrackerFileName), "latest_checkpointed_iteration.txt");
}

TEST(CheckpointDir, TrackerParsing) {
  TempDir dir;
  EXPECT_FALSE(read_tracker(dir.path()).has_value());
  EXPECT_FALSE(read_tracker(dir / "does/not/exist").has_value());
  const std::string tracker = dir / kTrackerFileName;
  spit(tracker, "100");
  EXPECT_EQ(read_tracker(dir.path())->iteration, 100);
  spit(tracker, "  2000\n");
  EXPECT_EQ(read_tracker(dir.path())->iteration, 2000);
  spit(tracker, "release\n");
  EXPECT_TRUE(read_tracker(dir.path())->release);
  for (const char* garbage : {"", "abc", "-5", "1e3", "100 200", "\x01\x02", "99999999999999999999999"}) {
    spit(tracker, garbage);
    std::string msg = error_of([&] { read_tracker(dir.path()); });
    EXPECT_NE(msg.find(tracker), std::string::npos) << "'" << garbage << "': " << msg;
    EXPECT_NE(msg.find("not an iteration number"), std::string::npos) << msg;
  }
}

TEST(CheckpointDir, ADamagedTrackerPrintsEscapedAndNamesTheIterations) {
  TempDir dir;
  save(dir.path(), 100, "a", 1);
  spit(dir / kTrackerFileName, "\x01\xc8" + std::string(50, 'x'));
  const std::string msg = error_of([&] { read_tracker(dir.path()); });
  EXPECT_NE(msg.find("holds '\\x01\\xc8" + std::string(32, 'x') + "...', not an iteration number"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("or load one with --ckpt-step N (complete iterations found: 100)"), std::string::npos) << msg;
}

TEST(CheckpointDir, LocateErrorsAreClear) {
  TempDir dir;
  std::string msg = error_of([&] { locate_latest_checkpoint(dir / "missing"); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;

  msg = error_of([&] { locate_latest_checkpoint(dir.path()); });
  EXPECT_NE(msg.find("latest_checkpointed_iteration.txt is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no checkpoint directories"), std::string::npos) << msg;

  save(dir.path(), 100, "a", 1);
  save(dir.path(), 200, "b", 1);
  fs::remove(dir / kTrackerFileName);
  msg = error_of([&] { locate_latest_checkpoint(dir.path()); });
  EXPECT_NE(msg.find("complete iterations found: 100, 200"), std::string::npos) << msg;

  spit(dir / kTrackerFileName, "300");
  msg = error_of([&] { locate_latest_checkpoint(dir.path()); });
  EXPECT_NE(msg.find("names iteration 300"), std::string::npos) << msg;
  EXPECT_NE(msg.find("iter_0000300 does not exist"), std::string::npos) << msg;

  spit(dir / kTrackerFileName, "200");
  EXPECT_EQ(load(dir.path()).iteration, 200);
  EXPECT_EQ(locate_checkpoint(dir.path(), 100).path, dir / "iter_0000100");
  msg = error_of([&] { locate_checkpoint(dir.path(), 150); });
  EXPECT_NE(msg.find("no checkpoint for iteration 150"), std::string::npos) << msg;
}

// The message of what `f` throws when run as a user the checkpoint's files are not open to (root
// reads everything: a child process drops to nobody), or "" when it throws nothing.
std::string error_as_nobody(const std::function<void()>& f) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    std::string message = "could not become nobody";
    if (::geteuid() != 0 || (::setgid(65534) == 0 && ::setuid(65534) == 0)) message = error_of(f);
    (void)!::write(fds[1], message.data(), message.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string message;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) message.append(buffer, size_t(n));
  ::close(fds[0]);
  ::waitpid(child, nullptr, 0);
  return message;
}

// An iteration directory that cannot be loaded is named with what is wrong with it and the other
// complete iterations to load instead, never as a raw filesystem error.
TEST(CheckpointDir, AnUnusableIterationDirectoryNamesTheOthers) {
  TempDir dir;
  save(dir.path(), 100, "a", 1);
  save(dir.path(), 200, "b", 1);
  const std::string others = "; load another complete iteration with --ckpt-step N (complete iterations: 100)";
  const std::string iter200 = dir / "iter_0000200";

  fs::permissions(dir.path(), fs::perms::all);  // nobody may enter it
  for (const auto& e : fs::recursive_directory_iterator(dir.path()))
    fs::permissions(e.path(), e.is_directory() ? fs::perms::all : fs::perms::all & ~fs::perms::others_exec);
  fs::permissions(iter200, fs::perms::none);
  std::string msg = error_as_nobody([&] { locate_latest_checkpoint(dir.path()); });
  EXPECT_NE(msg.find("names iteration 200 but " + iter200 + " cannot be read (permission denied): give this user "
                     "read and search permission on it (chmod -R u+rX " + iter200 + ")" + others),
            std::string::npos) << msg;
  msg = error_as_nobody([&] { locate_checkpoint(dir.path(), 200); });
  EXPECT_NE(msg.find("cannot be read (permission denied)"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("filesystem error"), std::string::npos) << msg;
  fs::permissions(iter200, fs::perms::all);

  fs::permissions(dir / kTrackerFileName, fs::perms::none);
  msg = error_as_nobody([&] { read_tracker(dir.path()); });
  EXPECT_NE(msg.find("could not read " + dir / kTrackerFileName + ": permission denied while opening it"),
            std::string::npos) << msg;
  EXPECT_EQ(msg.find("save elsewhere"), std::string::npos) << msg;
  fs::permissions(dir / kTrackerFileName, fs::perms::owner_read | fs::perms::owner_write);

  fs::rename(iter200, dir / "moved");
  spit(iter200, "x");
  msg = error_of([&] { locate_latest_checkpoint(dir.path()); });
  EXPECT_NE(msg.find(iter200 + " is a file, not a checkpoint directory" + others), std::string::npos) << msg;
  fs::remove(iter200);
  fs::create_symlink(dir / "gone", iter200);
  msg = error_of([&] { locate_checkpoint(dir.path(), 200); });
  EXPECT_NE(msg.find(iter200 + " is a symbolic link to " + dir / "gone" + ", which does not exist" + others),
            std::string::npos) << msg;
  fs::remove(iter200);
  fs::rename(dir / "moved", iter200);

  remove_tree(dir / "iter_0000100");  // not fs::remove_all: LibTorch bundles a copy that crashes here
  EXPECT_EQ(with_other_iterations("x is corrupt", dir.path(), 200),
            "x is corrupt; there is no other complete iteration in " + dir.path() + " to load instead: restore it "
            "from a copy");
  EXPECT_EQ(with_other_iterations("x; use --ckpt-step 5", dir.path(), 200), "x; use --ckpt-step 5");
}

// Resuming an older iteration past a dangling link left where a newer one was: the save replaces it.
TEST(CheckpointDir, ASaveReplacesADanglingLinkOfItsName) {
  TempDir dir;
  save(dir.path(), 100, "a", 1);
  fs::create_symlink(dir / "gone", dir / "iter_0000200");
  save(dir.path(), 200, "b", 1);
  EXPECT_EQ(load(dir.path()).iteration, 200);
  EXPECT_FALSE(fs::is_symlink(dir / "iter_0000200"));
}

TEST(CheckpointDir, DamagedBytesPrintEscapedAndBounded) {
  EXPECT_EQ(escaped_bytes("abc"), "abc");
  EXPECT_EQ(escaped_bytes(std::string("a\0\xc8\n\\", 5)), "a\\x00\\xc8\\x0a\\\\");
  EXPECT_EQ(escaped_bytes(std::string(100, 'z')), std::string(40, 'z') + "...");
  EXPECT_EQ(escaped_bytes(std::string(20, '\xff')), "\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff...");
  std::string nine;
  for (int i = 0; i < 9; ++i) nine += "\\x01";
  EXPECT_EQ(escaped_parse_error("syntax error; last read: '" + std::string(60, '\x01') + "'"),
            "syntax error; last read: '" + nine + "...");
  EXPECT_EQ(read_error_message("opening", "/c/x", EACCES).find("save"), std::string::npos);
  EXPECT_EQ(read_error_message("opening", "/c/x", EACCES).rfind("could not read /c/x: permission denied while opening it", 0),
            0u);
}

TEST(CheckpointDir, SaveCommitLoad) {
  TempDir dir;
  save(dir / "run", 100, "t100", 1);
  EXPECT_EQ(slurp(dir / "run/latest_checkpointed_iteration.txt"), "100");  // as Megatron: no newline
  Loaded l = load(dir / "run");
  EXPECT_EQ(l.iteration, 100);
  save(dir / "run", 200, "t200", 1);
  EXPECT_EQ(load(dir / "run").iteration, 200);
  EXPECT_EQ(list_checkpoint_iterations(dir / "run"), (std::vector<int64_t>{100, 200}));
  EXPECT_TRUE(leftovers(dir / "run").empty());
  // Re-saving the same iteration replaces it.
  save(dir / "run", 200, "t200b", 2);
  EXPECT_EQ(load(dir / "run").generation, 2);
  EXPECT_TRUE(leftovers(dir / "run").empty());
  // Release checkpoints.
  save(dir / "run", 0, "rel", 3, std::nullopt, {}, true);
  EXPECT_EQ(slurp(dir / "run/latest_checkpointed_iteration.txt"), "release");
  CheckpointLocation loc = locate_latest_checkpoint(dir / "run");
  EXPECT_TRUE(loc.release);
  EXPECT_EQ(loc.path, dir / "run/release");
}

TEST(CheckpointDir, StaleTemporariesAreIgnoredThenCleaned) {
  TempDir dir;
  save(dir.path(), 100, "a", 1);
  // A crashed save left a temporary directory with a half-written shard.
  SaveTarget crashed{dir.path(), 200, false, "crashed"};
  std::string tmp = begin_save(crashed);
  spit(tmp + "/rank_0.safetensors.partial", "garbage");
  EXPECT_EQ(list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{100}));
  EXPECT_EQ(load(dir.path()).iteration, 100);
  // Committing it is refused: its files are missing.
  std::string msg = error_of([&] {
    CommitOptions o;
    o.expected_files = expected_files();
    commit_save(crashed, o);
  });
  EXPECT_NE(msg.find("rank_0.safetensors is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("previous checkpoint is kept"), std::string::npos) << msg;
  EXPECT_EQ(load(dir.path()).iteration, 100);
  // The next good save removes it.
  save(dir.path(), 300, "b", 1);
  EXPECT_TRUE(leftovers(dir.path()).empty()) << leftovers(dir.path())[0];
  EXPECT_EQ(load(dir.path()).iteration, 300);
}

TEST(CheckpointDir, FileCountMismatchIsRefused) {
  TempDir dir;
  SaveTarget t{dir.path(), 5, false, "x"};
  std::string tmp = begin_save(t);
  spit(tmp + "/a", "1");
  CommitOptions o;
  o.expected_file_count = 2;
  std::string msg = error_of([&] { commit_save(t, o); });
  EXPECT_NE(msg.find("holds 1 files but 2 were expected"), std::string::npos) << msg;
  EXPECT_FALSE(read_tracker(dir.path()).has_value());
}

// Crash after each step, for: a first save, a save of a new iteration, a re-save of the
// tracker's iteration.
enum class Scenario { kFirst, kNewIteration, kResave };

class CrashDuringCommit : public ::testing::TestWithParam<std::tuple<Scenario, CommitStep>> {};

TEST_P(CrashDuringCommit, TrackerAlwaysNamesACompleteCheckpoint) {
  auto [scenario, step] = GetParam();
  TempDir dir;
  const std::string d = dir.path();
  if (scenario != Scenario::kFirst) save(d, 100, "prev", 1);
  const int64_t iteration = scenario == Scenario::kResave ? 100 : 200;

  bool crashed = false;
  try {
    save(d, iteration, "crash", 2, step);
  } catch (const SimulatedCrash& c) {
    crashed = true;
    EXPECT_EQ(c.step, step);
  }
  // kOldMovedAside only happens on a re-save.
  EXPECT_EQ(crashed, step != CommitStep::kOldMovedAside || scenario == Scenario::kResave);

  const bool tracker_updated = !crashed || step >= CommitStep::kTrackerCommitted;
  if (scenario == Scenario::kFirst && !tracker_updated) {
    EXPECT_FALSE(read_tracker(d).has_value());
  } else {
    Loaded l = load(d);
    if (tracker_updated) {
      EXPECT_EQ(l.iteration, iteration);
      EXPECT_EQ(l.generation, 2);
    } else {
      EXPECT_EQ(l.iteration, 100);
      // A re-save interrupted after its rename already serves the new (complete) copy.
      bool renamed = scenario == Scenario::kResave && step >= CommitStep::kRenamed;
      EXPECT_EQ(l.generation, renamed ? 2 : 1) << commit_step_name(step);
    }
  }

  // The run restarts and saves again: everything stale is cleaned, the new one loads.
  save(d, 300, "next", 3);
  Loaded l = load(d);
  EXPECT_EQ(l.iteration, 300);
  EXPECT_EQ(l.generation, 3);
  auto left = leftovers(d);
  EXPECT_TRUE(left.empty()) << left[0];
  if (scenario != Scenario::kFirst) {
    // The earlier checkpoint survived too (a moved-aside copy is renamed back).
    EXPECT_EQ(locate_checkpoint(d, 100).path, d + "/iter_0000100");
  }
}

std::string crash_case_name(const ::testing::TestParamInfo<std::tuple<Scenario, CommitStep>>& info) {
  static const char* const kScenario[] = {"First", "NewIteration", "Resave"};
  std::string name = std::string(kScenario[int(std::get<0>(info.param))]) + "_" +
                     commit_step_name(std::get<1>(info.param));
  for (char& c : name)
    if (c == ' ') c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    AllSteps, CrashDuringCommit,
    ::testing::Combine(::testing::Values(Scenario::kFirst, Scenario::kNewIteration, Scenario::kResave),
                       ::testing::Values(CommitStep::kFilesVerified, CommitStep::kFilesSynced,
                                         CommitStep::kOldMovedAside, CommitStep::kRenamed,
                                         CommitStep::kTrackerTempWritten, CommitStep::kTrackerCommitted,
                                         CommitStep::kCleanedUp)),
    crash_case_name);

TEST(CheckpointDir, DiskFullDuringShardWriteKeepsPreviousCheckpoint) {
  TempDir dir;
  save(dir.path(), 100, "prev", 1);
  std::string msg = error_of([&] { save(dir.path(), 200, "full", 2, std::nullopt, {40, ENOSPC}); });
  EXPECT_NE(msg.find("disk full"), std::string::npos) << msg;
  EXPECT_NE(msg.find("iter_0000200.tmp.full/rank_1.safetensors"), std::string::npos) << msg;
  abort_save({dir.path(), 200, false, "full"});
  EXPECT_FALSE(fs::exists(dir / "iter_0000200.tmp.full"));
  Loaded l = load(dir.path());
  EXPECT_EQ(l.iteration, 100);
  EXPECT_EQ(l.generation, 1);
  EXPECT_EQ(list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{100}));
}

TEST(CheckpointDir, DiskFullWhileWritingTrackerKeepsPreviousTracker) {
  TempDir dir;
  save(dir.path(), 100, "prev", 1);
  SaveTarget t{dir.path(), 200, false, "tr"};
  std::string tmp = begin_save(t);
  int64_t v[3] = {200, 0, 2};
  for (int r = 0; r < kRanks; ++r) {
    v[1] = r;
    write_safetensors(tmp + "/rank_" + std::to_string(r) + ".safetensors", {{"value", DType::I64, {3}, v, {}}});
  }
  write_file_atomically(tmp + "/info.txt", "200 2");
  CommitOptions o;
  o.expected_files = expected_files();
  o.tracker_fault = {1, ENOSPC};
  std::string msg = error_of([&] { commit_save(t, o); });
  EXPECT_NE(msg.find("disk full"), std::string::npos) << msg;
  EXPECT_NE(msg.find(kTrackerFileName), std::string::npos) << msg;
  EXPECT_EQ(slurp(dir / kTrackerFileName), "100");
  EXPECT_EQ(load(dir.path()).iteration, 100);
  // The new directory is complete anyway and loadable by iteration.
  EXPECT_EQ(locate_checkpoint(dir.path(), 200).path, dir / "iter_0000200");
}

TEST(CheckpointDir, RanksMayRaceToBeginSave) {
  TempDir dir;
  SaveTarget t{dir / "a/b/c", 7, false, "race"};
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] {
      if (begin_save(t) == temp_dir_path(t)) ++ok;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_TRUE(fs::is_directory(temp_dir_path(t)));
}

TEST(CheckpointDir, BadTargets) {
  TempDir dir;
  EXPECT_THROW(begin_save({"", 1, false, "x"}), UserError);
  EXPECT_THROW(begin_save({dir.path(), -1, false, "x"}), UserError);
  EXPECT_ANY_THROW(begin_save({dir.path(), 1, false, "../evil"}));
  EXPECT_ANY_THROW(begin_save({dir.path(), 1, false, ""}));
  std::string msg = error_of([&] { commit_save({dir.path(), 1, false, "never"}); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fp8tron::checkpoint
