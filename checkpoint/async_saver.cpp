#include "checkpoint/async_saver.h"

#include <chrono>

#include "core/log.h"
#include "core/text.h"
#include "checkpoint/host_buffer.h"
#include "checkpoint/rank_agreement.h"
#include "checkpoint/save.h"
#include "checkpoint/save_torch_dist.h"

namespace fp8tron {

using Clock = std::chrono::steady_clock;

AsyncCheckpointSaver::AsyncCheckpointSaver() : snapshot_(std::make_unique<SnapshotBuffers>()) {
  snapshot_->stats = &stats_;
}

AsyncCheckpointSaver::~AsyncCheckpointSaver() {
  // An unfinished save is left uncommitted; the next successful commit there removes it.
  if (writer_.joinable()) writer_.join();
  if (snapshot_->reserving.joinable()) snapshot_->reserving.join();  // it writes stats_
}

void AsyncCheckpointSaver::reserve(const TrainingState& s) {
  if (snapshot_->reserving.joinable() || !snapshot_->buffers.empty()) return;
  // Only sizes and dtypes are read here; the thread allocates, faults in and pins the memory.
  // It runs beside start-up and the first iterations rather than before them: the first save
  // usually comes many iterations later, and start-up is not delayed by the allocation (several
  // seconds for a model in the billions of parameters). A save that comes sooner waits for it.
  struct Wanted {
    int64_t numel;
    torch::ScalarType dtype;
    int device;
  };
  std::vector<Wanted> wanted;
  for (const SaveSource& src : save_sources(s))
    wanted.push_back({src.end - src.begin, src.buffer.scalar_type(), pin_device(src.buffer)});
  SnapshotBuffers* snapshot = snapshot_.get();
  AsyncSaveStats* stats = &stats_;
  const bool pinned = s.device.is_cuda();
  snapshot->reserving = std::thread([snapshot, stats, wanted, pinned] {
    const auto start = Clock::now();
    try {
      for (const Wanted& w : wanted) {
        snapshot->reserved.push_back(allocate_host_tensor(w.numel, w.dtype, w.device));
        if (w.numel > 0) {
          ++stats->buffers_reserved;
          stats->bytes_reserved += w.numel * int64_t(c10::elementSize(w.dtype));
        }
      }
    } catch (const std::exception& e) {
      snapshot->reserved.clear();
      snapshot->reserve_error = e.what();
    }
    snapshot->reserve_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (snapshot->reserve_error.empty())
      log::info(strprintf(" > host memory for --async-save reserved in the background: %.2f GB%s in %.2f s",
                          double(stats->bytes_reserved) / 1e9, pinned ? " (pinned)" : "", snapshot->reserve_seconds.load()));
  });
}

void AsyncCheckpointSaver::save(const TrainingState& s, int64_t iteration, bool non_persistent) {
  const auto start = Clock::now();
  finalize(s, true);  // one save in flight: its host buffers are this one's
  const double waited_previous = std::chrono::duration<double>(Clock::now() - start).count();
  const bool torch_dist = s.config.checkpoint.save_torch_dist;
  const double waited_reserve = torch_dist ? -1 : snapshot_->take_reserved();
  const int64_t allocated_before = stats_.buffers_allocated_by_saves;
  int64_t copied = 0;
  double copy_seconds = 0;
  done_ = false;
  if (torch_dist) {
    pending_torch_dist_ = prepare_torch_dist_save(s, iteration, non_persistent, /*own_copies=*/true);
    copied = pending_torch_dist_->bytes_copied, copy_seconds = pending_torch_dist_->copy_seconds;
    writer_ = std::thread([this, rank = s.parallel.world_rank] {
      write_torch_dist_file(*pending_torch_dist_, rank);
      done_ = true;
    });
  } else {
    pending_ = prepare_save(s, iteration, non_persistent, snapshot_.get());
    copied = pending_->bytes_copied, copy_seconds = pending_->copy_seconds;
    writer_ = std::thread([this] {
      write_shards(*pending_);
      done_ = true;
    });
  }
  stats_.saves += 1;
  stats_.last_blocked_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  stats_.last_copy_seconds = copy_seconds;
  stats_.last_copied_bytes = copied;
  const int64_t allocated = stats_.buffers_allocated_by_saves - allocated_before;
  std::string detail = strprintf("copying %.2f GB to %s: %.2f s", double(copied) / 1e9,
                                 s.device.is_cuda() ? (torch_dist ? "host memory" : "pinned host memory") : "host memory",
                                 copy_seconds);
  if (allocated > 0) detail += strprintf(", %lld buffers allocated by this save", (long long)allocated);
  if (waited_reserve >= 0)  // the first save after reserve()
    detail += strprintf("; host memory reserved in the background at start-up: %.2f GB in %.2f s, waited %.2f s for it",
                        double(stats_.bytes_reserved) / 1e9, stats_.reserve_seconds, waited_reserve);
  if (waited_previous >= 0.005) detail += strprintf("; waiting for the previous save: %.2f s", waited_previous);
  log::info(strprintf("  training blocked %.2f s (%s); the checkpoint is written in the background",
                      stats_.last_blocked_seconds, detail.c_str()));
}

void AsyncCheckpointSaver::finalize(const TrainingState& s, bool blocking) {
  if (!pending()) return;  // saves happen at the same iterations on every rank: all agree
  if (!blocking) {
    // Commit only once every rank's writer is done; until then training goes on.
    bool all_done = done_;
    if (s.parallel.sizes.world_size > 1) all_done = !any_rank(s.parallel, s.device, !done_);
    if (!all_done) return;
  }
  writer_.join();
  if (pending_torch_dist_) {
    std::unique_ptr<PendingTorchDistSave> save = std::move(pending_torch_dist_);
    finalize_torch_dist_save(s, *save);
    return;
  }
  std::unique_ptr<PendingSave> save = std::move(pending_);
  finalize_save(s, *save);
}

}  // namespace fp8tron
