// The reusable host memory of asynchronous saves (--async-save): one buffer per save source (by
// position), pinned for GPU buffers, allocated once in the background and reused from save to
// save; and the figures the saver reports about it.
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace fp8tron {

struct AsyncSaveStats {
  int64_t buffers_reserved = 0;            // allocated by reserve()
  int64_t bytes_reserved = 0;
  double reserve_seconds = 0;              // the background allocation (known after the first save)
  int64_t buffers_allocated_by_saves = 0;  // allocated inside save() (none when the reservation fit)
  int64_t saves = 0;
  double last_blocked_seconds = 0;         // training blocked in the last save()
  double last_copy_seconds = 0;            // of which copying to host memory
  int64_t last_copied_bytes = 0;
};

struct SnapshotBuffers {
  std::vector<torch::Tensor> buffers;
  std::thread reserving;                 // until joined: the background allocation
  std::vector<torch::Tensor> reserved;   // its result
  std::string reserve_error;             // its failure, reported at the first save
  std::atomic<double> reserve_seconds{0};
  AsyncSaveStats* stats = nullptr;

  ~SnapshotBuffers();
  // Joins the background allocation (if any) and takes its buffers; returns the seconds waited,
  // or -1 when there was nothing to join.
  double take_reserved();
  // The buffer for source `index`: reused when it has the size and dtype wanted.
  torch::Tensor get(size_t index, int64_t numel, torch::ScalarType dtype, int pin_for_device);
};

}  // namespace fp8tron
