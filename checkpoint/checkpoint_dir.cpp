#include "checkpoint/checkpoint_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/text.h"
#include "checkpoint/fault_points.h"
#include "checkpoint/megatron/damage.h"
#include "checkpoint/other_iterations.h"

namespace fp8tron::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string join_path(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

bool is_directory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

// "" when `path` is a directory this process can list and enter; otherwise what is wrong with it.
std::string unusable_directory(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? "does not exist" : std::strerror(errno);
  if (S_ISLNK(st.st_mode) && ::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    std::error_code ec;
    const std::string target = fs::read_symlink(path, ec).string();
    return "is a symbolic link to " + target + ", which " +
           (err == ENOENT ? std::string("does not exist")
                          : "cannot be reached (" + std::string(std::strerror(err)) + ")");
  }
  if (!S_ISDIR(st.st_mode)) return "is a file, not a checkpoint directory";
  if (::access(path.c_str(), R_OK | X_OK) != 0)
    return errno == EACCES ? "cannot be read (permission denied): give this user read and search permission on it "
                             "(chmod -R u+rX " + path + ")"
                           : "cannot be read (" + std::string(std::strerror(errno)) + ")";
  return "";
}

bool valid_token(const std::string& token) {
  if (token.empty() || token.size() > 128) return false;
  for (char c : token)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) return false;
  return true;
}

// "iter_0000100" -> 100; "release" -> release; anything else (including "iter_0000100.tmp.x")
// -> nullopt.
std::optional<Tracker> parse_dir_name(const std::string& name) {
  if (name == "release") return Tracker{0, true};
  if (name.size() < 12 || name.compare(0, 5, "iter_") != 0) return std::nullopt;
  int64_t it = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return std::nullopt;
    if (it > (INT64_MAX - 9) / 10) return std::nullopt;
    it = it * 10 + (name[i] - '0');
  }
  return Tracker{it, false};
}

// "<base>.tmp.<token>", "<base>.old.<token>" or "<base>.del.<token>" where base is an iteration
// or release name.
bool is_stale_work_dir(const std::string& name) {
  for (const char* kind : {".tmp.", ".old.", ".del."}) {
    size_t at = name.find(kind);
    if (at == std::string::npos) continue;
    if (parse_dir_name(name.substr(0, at)) && valid_token(name.substr(at + 5))) return true;
  }
  return false;
}

std::string tracker_text(const Tracker& t) {
  return t.release ? std::string("release") : std::to_string(t.iteration);
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw UserError(io_error_message(("renaming " + from + " to").c_str(), to, errno));
}

std::string available_summary(const std::string& dir) {
  auto its = list_checkpoint_iterations(dir);
  bool release = is_directory(join_path(dir, "release"));
  if (its.empty() && !release) return "it holds no checkpoint directories";
  std::vector<std::string> names;
  for (int64_t it : its) names.push_back(std::to_string(it));
  std::string s = its.empty() ? "" : "complete iterations found: " + join(names, ", ");
  if (release) s += std::string(s.empty() ? "" : "; ") + "a release/ directory exists";
  return s;
}

// A re-save of the tracker's own iteration that crashed between moving the old copy aside and
// renaming the new one into place leaves only "<name>.old.<token>"; it is complete.
std::optional<std::string> moved_aside_copy(const std::string& dir, const std::string& name) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind(name + ".old.", 0) == 0 && valid_token(n.substr(name.size() + 5)) &&
        e.is_directory(ec))
      return e.path().string();
  }
  return std::nullopt;
}

}  // namespace

std::string checkpoint_dir_name(int64_t iteration, bool release) {
  if (release) return "release";
  FP8TRON_CHECK(iteration >= 0, "negative iteration " + std::to_string(iteration));
  return strprintf("iter_%07lld", (long long)iteration);
}

std::string non_persistent_dir(const std::string& configured, const std::string& base) {
  return configured.empty() ? base + "/non_persistent" : configured;
}

const char* commit_step_name(CommitStep step) {
  switch (step) {
    case CommitStep::kFilesVerified: return "files verified";
    case CommitStep::kFilesSynced: return "files synced";
    case CommitStep::kOldMovedAside: return "old copy moved aside";
    case CommitStep::kRenamed: return "renamed into place";
    case CommitStep::kTrackerTempWritten: return "tracker temp written";
    case CommitStep::kTrackerCommitted: return "tracker committed";
    case CommitStep::kCleanedUp: return "cleaned up";
  }
  return "?";
}

std::optional<Tracker> read_tracker(const std::string& dir) {
  const std::string path = join_path(dir, kTrackerFileName);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::string text = read_file(path);
  // Megatron strips whitespace and accepts an integer or "release".
  auto b = text.find_first_not_of(" \t\r\n");
  auto e = text.find_last_not_of(" \t\r\n");
  std::string s = b == std::string::npos ? "" : text.substr(b, e - b + 1);
  if (s == "release") return Tracker{0, true};
  bool digits = !s.empty() && s.size() <= 18 &&
                std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits)
    throw DamagedCheckpoint(strprintf("%s holds '%s', not an iteration number or 'release'; write the iteration to "
                                      "load into it, or load one with --ckpt-step N (%s)",
                                      path.c_str(), escaped_bytes(s).c_str(), available_summary(dir).c_str()));
  return Tracker{std::stoll(s), false};
}

CheckpointLocation locate_latest_checkpoint(const std::string& load_dir) {
  if (!is_directory(load_dir))
    throw UserError(strprintf("checkpoint directory %s does not exist; check --load",
                              load_dir.c_str()));
  auto tracker = read_tracker(load_dir);
  if (!tracker)
    throw UserError(strprintf("no checkpoint to load in %s: %s is missing (%s)", load_dir.c_str(),
                              kTrackerFileName, available_summary(load_dir).c_str()));
  std::string name = checkpoint_dir_name(tracker->iteration, tracker->release);
  std::string path = join_path(load_dir, name);
  const std::string unusable = unusable_directory(path);
  if (!unusable.empty() && unusable != "does not exist") {
    const std::string named = tracker->release ? "release" : "iteration " + std::to_string(tracker->iteration);
    throw UserError(with_other_iterations(join_path(load_dir, kTrackerFileName) + " names " + named + " but " + path +
                                              " " + unusable,
                                          load_dir, tracker->release ? -1 : tracker->iteration));
  }
  if (!is_directory(path)) {
    if (auto aside = moved_aside_copy(load_dir, name))
      return {*aside, tracker->iteration, tracker->release};
    throw UserError(strprintf("%s names %s but %s does not exist (%s); fix the tracker or pass "
                              "--ckpt-step",
                              join_path(load_dir, kTrackerFileName).c_str(),
                              tracker->release ? "release" : ("iteration " + std::to_string(tracker->iteration)).c_str(),
                              path.c_str(), available_summary(load_dir).c_str()));
  }
  return {path, tracker->iteration, tracker->release};
}

CheckpointLocation locate_checkpoint(const std::string& load_dir, int64_t iteration) {
  if (iteration < 0)
    throw UserError(strprintf("checkpoint iteration %lld is negative", (long long)iteration));
  std::string name = checkpoint_dir_name(iteration);
  std::string path = join_path(load_dir, name);
  const std::string unusable = unusable_directory(path);
  if (!unusable.empty() && unusable != "does not exist")
    throw UserError(with_other_iterations(strprintf("checkpoint for iteration %lld: %s %s", (long long)iteration,
                                                    path.c_str(), unusable.c_str()),
                                          load_dir, iteration));
  if (!is_directory(path)) {
    if (auto aside = moved_aside_copy(load_dir, name)) return {*aside, iteration, false};
    throw UserError(strprintf("no checkpoint for iteration %lld: %s does not exist (%s)",
                              (long long)iteration, path.c_str(),
                              is_directory(load_dir) ? available_summary(load_dir).c_str()
                                                     : "the directory itself is missing"));
  }
  return {path, iteration, false};
}

std::vector<int64_t> list_checkpoint_iterations(const std::string& dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    auto t = parse_dir_name(e.path().filename().string());
    if (t && !t->release && e.is_directory(ec)) out.push_back(t->iteration);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string other_iterations_hint(const std::string& dir, int64_t iteration) {
  std::string others;
  for (int64_t it : list_checkpoint_iterations(dir))
    if (it != iteration && unusable_directory(join_path(dir, checkpoint_dir_name(it))).empty())
      others += (others.empty() ? "" : ", ") + std::to_string(it);
  if (others.empty())
    return "there is no other complete iteration in " + dir + " to load instead: restore it from a copy";
  return "load another complete iteration with --ckpt-step N (complete iterations: " + others + ")";
}

std::string with_other_iterations(const std::string& message, const std::string& dir, int64_t iteration) {
  if (message.find("--ckpt-step") != std::string::npos) return message;
  return message + "; " + other_iterations_hint(dir, iteration);
}

std::vector<std::string> list_checkpoint_files(const CheckpointLocation& location) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::directory_iterator it(location.path, ec);
  if (ec)
    throw UserError(strprintf("cannot list checkpoint directory %s: %s", location.path.c_str(),
                              ec.message().c_str()));
  for (const auto& e : it)
    if (e.is_regular_file(ec)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// ---- saving --------------------------------------------------------------------------------

std::string temp_dir_path(const SaveTarget& target) {
  return join_path(target.save_dir,
                   checkpoint_dir_name(target.iteration, target.release) + ".tmp." + target.token);
}

std::string final_dir_path(const SaveTarget& target) {
  return join_path(target.save_dir, checkpoint_dir_name(target.iteration, target.release));
}

static void check_target(const SaveTarget& target) {
  if (target.save_dir.empty()) throw UserError("checkpoint save directory is empty; set --save");
  if (!target.release && target.iteration < 0)
    throw UserError(strprintf("cannot save a checkpoint for negative iteration %lld",
                              (long long)target.iteration));
  FP8TRON_CHECK(valid_token(target.token),
                "checkpoint save token must be 1-128 letters, digits, '-' or '_': '" + target.token + "'");
}

std::string begin_save(const SaveTarget& target) {
  check_target(target);
  std::string tmp = temp_dir_path(target);
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec && !is_directory(tmp))
    throw UserError(io_error_message("creating checkpoint directory", tmp, ec.value()));
  return tmp;
}

void commit_save(const SaveTarget& target, const CommitOptions& options) {
  check_target(target);
  auto step = [&](CommitStep s) {
    if (options.hook) options.hook(s);
  };
  const std::string tmp = temp_dir_path(target);
  const std::string final_dir = final_dir_path(target);
  const std::string& save = target.save_dir;
  if (!is_directory(tmp))
    throw UserError(strprintf("cannot commit checkpoint: %s does not exist (begin_save not called, "
                              "or a rank removed it)", tmp.c_str()));

  // 1. Every expected file is there (each was written as .partial and renamed when complete).
  std::error_code ec;
  for (const auto& f : options.expected_files) {
    if (!fs::is_regular_file(join_path(tmp, f), ec))
      throw UserError(strprintf("checkpoint save incomplete: %s is missing (a rank failed to write "
                                "it); the previous checkpoint is kept",
                                join_path(tmp, f).c_str()));
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(tmp, ec))
    if (e.is_regular_file(ec)) files.push_back(e.path().string());
  if (options.expected_file_count >= 0 && int64_t(files.size()) != options.expected_file_count)
    throw UserError(strprintf("checkpoint save incomplete: %s holds %zu files but %lld were "
                              "expected; the previous checkpoint is kept",
                              tmp.c_str(), files.size(), (long long)options.expected_file_count));
  step(CommitStep::kFilesVerified);

  // 2. Data and directory entries on disk before the directory gets its final name.
  for (const auto& f : files) fsync_path(f);
  fsync_path(tmp);
  step(CommitStep::kFilesSynced);

  // 3. Into place. Re-saving an iteration: move the old copy aside, delete it only later.
  std::string aside;
  struct stat existing {};
  if (::lstat(final_dir.c_str(), &existing) == 0) {  // a dangling link too: renaming onto it fails
    aside = join_path(save, checkpoint_dir_name(target.iteration, target.release) + ".old." + target.token);
    rename_or_throw(final_dir, aside);
    step(CommitStep::kOldMovedAside);
  }
  rename_or_throw(tmp, final_dir);
  fsync_path(save);
  step(CommitStep::kRenamed);

  // 4. Tracker: temp file + fsync, rename, fsync parent.
  if (options.update_tracker) {
    const std::string tracker = join_path(save, kTrackerFileName);
    const std::string tracker_tmp = tracker + ".tmp." + target.token;
    {
      FileWriter w(tracker_tmp, options.tracker_fault, tracker);
      std::string text = tracker_text({target.iteration, target.release});
      w.write(text.data(), text.size());
      w.sync();
      w.close();
    }
    step(CommitStep::kTrackerTempWritten);
    rename_or_throw(tracker_tmp, tracker);
    fsync_path(save);
    step(CommitStep::kTrackerCommitted);
  }

  // 5. Clean-up: the old copy, stale temporaries of crashed saves, stray tracker temps. A
  // moved-aside copy whose directory no longer exists (a re-save crashed between its renames)
  // is renamed back instead: it is a complete checkpoint.
  std::vector<fs::path> doomed;
  std::vector<std::pair<fs::path, fs::path>> restore;
  for (const auto& e : fs::directory_iterator(save, ec)) {
    std::string n = e.path().filename().string();
    if (is_stale_work_dir(n) && e.is_directory(ec)) {
      size_t at = n.find(".old.");
      fs::path base = fs::path(save) / n.substr(0, at);
      bool orphan = at != std::string::npos && !fs::exists(base, ec) &&
                    std::none_of(restore.begin(), restore.end(), [&](const auto& r) { return r.second == base; });
      if (orphan)
        restore.emplace_back(e.path(), base);
      else
        doomed.push_back(e.path());
    } else if (n.rfind(std::string(kTrackerFileName) + ".tmp.", 0) == 0 && e.is_regular_file(ec)) {
      doomed.push_back(e.path());
    }
  }
  for (const auto& [from, to] : restore) fs::rename(from, to, ec);
  if (!restore.empty()) fsync_path(save);
  for (const auto& p : doomed) remove_tree(p.string());  // best effort: a leftover is retried by the next commit
  step(CommitStep::kCleanedUp);
}

DeleteResult delete_checkpoint(const std::string& dir, int64_t iteration, const std::string& token) noexcept {
  try {
    if (!valid_token(token)) return DeleteResult::kFailed;
    const std::string path = join_path(dir, checkpoint_dir_name(iteration));
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return DeleteResult::kMissing;
    if (S_ISLNK(st.st_mode)) return DeleteResult::kSymlink;
    const std::string aside = join_path(dir, checkpoint_dir_name(iteration) + ".del." + token);
    if (std::rename(path.c_str(), aside.c_str()) != 0) return DeleteResult::kFailed;
    fsync_path(dir);
    fault_point("retention:renamed-aside");
    const bool removed = remove_tree(aside);
    fault_point("retention:removed");
    return removed ? DeleteResult::kDeleted : DeleteResult::kFailed;
  } catch (...) {
    return DeleteResult::kFailed;
  }
}

void abort_save(const SaveTarget& target) noexcept {
  try {
    if (!valid_token(target.token)) return;
    remove_tree(temp_dir_path(target));
  } catch (...) {
  }
}

}  // namespace fp8tron::checkpoint
