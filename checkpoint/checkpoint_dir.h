// Megatron's checkpoint directory layout and an atomic commit protocol on top of it.
//
//   <save>/latest_checkpointed_iteration.txt   "100" (no newline, as Megatron) or "release"
//   <save>/iter_0000100/                        one complete checkpoint (release: <save>/release/)
//   <save>/iter_0000200.tmp.<token>/            a save in progress (never read)
//   <save>/iter_0000100.old.<token>/            a re-saved iteration's previous copy, moved aside
//   <save>/iter_0000100.del.<token>/            a checkpoint being deleted (retention), moved aside
//
// Saving: every rank calls begin_save() and writes its files into the temporary directory;
// after a barrier one rank calls commit_save(), which verifies the expected files, fsyncs them
// and the directory, renames the directory into place (moving an existing one aside first and
// deleting it only after the rename), fsyncs <save>, then replaces the tracker atomically
// (temp file, fsync, rename, fsync <save>). A crash at any point leaves the tracker naming a
// complete checkpoint (the only window where the tracker's directory is missing — a re-save of
// the same iteration between its two renames — is covered by reading the ".old." copy).
// One save may be in flight per save directory: a successful commit deletes every other
// ".tmp." directory there, every ".del." one and every ".old." one (renaming an ".old." copy back
// to its iteration's name instead when that name is free).
//
// Deleting a checkpoint (retention) renames it aside to ".del." first and only then removes the
// files, so a crash in between never leaves a half-deleted directory under a checkpoint's name.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/file_io.h"

namespace fp8tron::checkpoint {

inline constexpr const char* kTrackerFileName = "latest_checkpointed_iteration.txt";

// "iter_0000100" (Megatron's iter_%07d), or "release".
std::string checkpoint_dir_name(int64_t iteration, bool release = false);

// Where the non-persistent checkpoints of `base` (--save or --load) live: `configured`
// (--non-persistent-global-ckpt-dir) when given, else <base>/non_persistent.
std::string non_persistent_dir(const std::string& configured, const std::string& base);

struct Tracker {
  int64_t iteration = 0;  // meaningful when !release
  bool release = false;
};

// The tracker in `dir`; nullopt when the file does not exist (Megatron then starts from
// scratch). Garbage contents are a UserError naming the file.
std::optional<Tracker> read_tracker(const std::string& dir);

// A checkpoint to read: `path` is the directory holding its files.
struct CheckpointLocation {
  std::string path;
  int64_t iteration = 0;
  bool release = false;
  bool finetune = false;  // loaded as --finetune loads (a --pretrained-checkpoint)
};

// The checkpoint the tracker names. UserErrors: no tracker (listing complete checkpoints found,
// if any), garbage tracker, tracker naming a missing directory.
CheckpointLocation locate_latest_checkpoint(const std::string& load_dir);
// A given iteration (Megatron's --ckpt-step), ignoring the tracker.
CheckpointLocation locate_checkpoint(const std::string& load_dir, int64_t iteration);

// Iterations with a complete (committed) directory in `dir`, ascending; temporary and
// moved-aside directories are not listed.
std::vector<int64_t> list_checkpoint_iterations(const std::string& dir);
// Regular files directly inside a checkpoint directory, sorted.
std::vector<std::string> list_checkpoint_files(const CheckpointLocation& location);

// ---- saving --------------------------------------------------------------------------------

struct SaveTarget {
  std::string save_dir;
  int64_t iteration = 0;
  bool release = false;
  // The same on every rank (e.g. rank 0's start time broadcast, or the job id + iteration);
  // letters, digits, '-' and '_' only.
  std::string token;
};

std::string temp_dir_path(const SaveTarget& target);   // <save>/iter_0000100.tmp.<token>
std::string final_dir_path(const SaveTarget& target);  // <save>/iter_0000100

// Every rank: creates <save> and the temporary directory (idempotent, safe to race) and
// returns the temporary directory's path.
std::string begin_save(const SaveTarget& target);

// The steps of commit_save, in order; the hook is called after each one (tests throw from it
// to simulate a crash there).
enum class CommitStep {
  kFilesVerified,
  kFilesSynced,
  kOldMovedAside,      // only when the final directory already existed
  kRenamed,            // temporary -> final, parent synced
  kTrackerTempWritten, // tracker's temporary file written and synced
  kTrackerCommitted,   // tracker renamed, parent synced
  kCleanedUp,          // old copy and stale temporaries removed
};
const char* commit_step_name(CommitStep step);

struct CommitOptions {
  // Files (names relative to the temporary directory) that must exist, e.g. every rank's shard
  // and the metadata file. A missing one aborts the commit with an error naming it.
  std::vector<std::string> expected_files;
  // When >= 0: the number of regular files the directory must hold.
  int64_t expected_file_count = -1;
  bool update_tracker = true;
  std::function<void(CommitStep)> hook;
  FaultInjection tracker_fault;  // tests: make the tracker write fail
};

// One rank, after every rank finished writing. Throws UserError when files are missing or the
// file system fails; the previous checkpoint and tracker then stay as they were.
void commit_save(const SaveTarget& target, const CommitOptions& options = {});

// Removes the temporary directory of a failed save (best effort, never throws).
void abort_save(const SaveTarget& target) noexcept;

enum class DeleteResult { kDeleted, kMissing, kSymlink, kFailed };
// Deletes the committed checkpoint of `iteration` in `dir`: renamed to
// iter_NNNNNNN.del.<token> (and the directory synced), then removed. A symbolic link is left alone
// (as Megatron does). Never throws; a leftover ".del." directory is removed by the next commit.
DeleteResult delete_checkpoint(const std::string& dir, int64_t iteration, const std::string& token) noexcept;

}  // namespace fp8tron::checkpoint
