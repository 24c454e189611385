// Host memory for --async-save snapshots: large blocks whose pages are faulted in up front and,
// when they receive copies from a GPU, registered with CUDA (pinned), wrapped as CPU tensors that
// own them.
//
// Why not torch::empty(..., pinned_memory(true)): torch's caching host allocator rounds every
// block up to a power of two (a 5.2 GB Adam moment takes 8 GB of pinned memory) and keeps blocks
// cached after they are freed, and cudaHostAlloc zero-fills and pins the pages in one
// single-threaded driver call, about 2 GB/s (8.4 s for the 1.3B model's 18 GB on an H200 host).
// Here the block is an anonymous mapping (transparent huge pages where the kernel allows), its
// pages are faulted in by a few threads with no driver involved, and one cudaHostRegister then
// pins the pages already there. The exact size is used and the memory returns to the system when
// the last tensor using it goes away.
#pragma once
#include <torch/torch.h>

#include <cstdint>

namespace fp8tron {

// A 1-D CPU tensor of `numel` elements of `dtype` over such a block (contents zero).
// `pin_for_device` >= 0: the block is registered with CUDA for copies to and from that device
// (the calling thread's current device is set to it); -1: plain pageable memory (CPU runs).
// Throws UserError when the memory cannot be mapped or pinned, naming the size.
torch::Tensor allocate_host_tensor(int64_t numel, torch::ScalarType dtype, int pin_for_device);

}  // namespace fp8tron
