// Grouped GEMMs: the independent per-expert GEMMs of a mixture-of-experts layer, issued as one
// launch sequence spread over a few side streams (Transformer Engine's multi-stream cuBLASLt
// grouped GEMM on Hopper; cuBLASLt 13.1 has no grouped API, and one expert's GEMM alone does not
// fill an H200 when experts are small).
//
//   fork   an event recorded on the caller's stream; every side stream used waits for it, so the
//          GEMMs see everything enqueued before (the quantize pass, the output allocation)
//   issue  each GEMM on the side stream with the least work (m * n * k) so far, in the given order
//          (round-robin when the experts are balanced); each side stream has its own cuBLASLt
//          workspace (GemmHandle keeps one per stream)
//   join   every used side stream records an event the caller's stream waits for: work enqueued
//          after the call (and the caching allocator's reuse of the operands' memory, which follows
//          the caller's stream) comes after the GEMMs
// A single GEMM runs on the caller's stream. Works under CUDA graph capture (fork/join by events
// is how side streams join a capture).
//
// Measured on an H200 (notes/moe.md 12.3, GEMM-only, CUDA graphs): 4 streams give per-expert FP8
// GEMMs 1385 TFLOP/s at 8 x 4096 tokens, 2048 -> 5632 and 1091 at 64 x 1536, 2048 -> 1408; 2
// streams nearly as much, 8 less. Hence kGroupedGemmStreams = 4.
//
// Plans: the grouped GEMMs use GemmConfig::bucket (gemm.h), one plan per token-count bucket,
// heuristic first choice, no autotuning and no host synchronisation on the way.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "fp8/gemm.h"

struct CUstream_st;
struct CUevent_st;

namespace fp8tron::fp8 {

constexpr int kGroupedGemmStreams = 4;

// A pool of side streams (high priority, non-blocking, of the current device) and their events.
class SideStreams {
 public:
  explicit SideStreams(int count);
  ~SideStreams();
  SideStreams(const SideStreams&) = delete;
  SideStreams& operator=(const SideStreams&) = delete;

  size_t size() const { return streams_.size(); }
  CUstream_st* stream(size_t i) const { return streams_[i]; }

 private:
  friend class FanOut;
  std::vector<CUstream_st*> streams_;
  std::vector<CUevent_st*> done_;  // one per side stream (join)
  CUevent_st* ready_ = nullptr;    // recorded on the caller's stream (fork)
  std::mutex mutex_;               // one fan-out at a time (the events are reused)
};

// One fan-out of `jobs` pieces of work from `main` (RAII: forks in the constructor, joins in the
// destructor). stream_for(job, work) picks the stream for the next job.
class FanOut {
 public:
  FanOut(SideStreams& pool, CUstream_st* main, size_t jobs);
  ~FanOut();
  FanOut(const FanOut&) = delete;
  FanOut& operator=(const FanOut&) = delete;

  // The stream to enqueue a job of `work` (any proportional measure) on: the least loaded.
  CUstream_st* stream_for(double work);

 private:
  SideStreams& pool_;
  CUstream_st* main_;
  std::unique_lock<std::mutex> lock_;
  std::vector<double> load_;  // per used side stream; empty: everything on main
};

// One GEMM of a group: gemm()'s operands, output and configuration.
struct GroupedGemm {
  GemmProblem problem;
  GemmConfig config;
};

// Runs every GEMM of the group (fork, issue, join) on `pool`'s streams.
void grouped_gemm(GemmHandle& handle, SideStreams& pool, const std::vector<GroupedGemm>& gemms, CUstream_st* main);

// The cuBLASLt handle (heuristic algorithm selection; bucketed plans) and side streams the grouped
// GEMMs of the current device share, created on first use and kept for the process (like torch's
// per-device cuBLAS handles and stream pools): per-module copies would multiply the 32 MiB
// workspaces. The bf16 linears' wgrad-with-bias-gradient GEMMs (models/linear/linear_grads.cpp) and the
// fused GeLU MLP's epilogue GEMMs (models/mlp/fused_gelu_mlp.cpp) use the same handle.
struct GroupedGemmResources {
  GemmHandle handle;
  SideStreams streams;
  GroupedGemmResources();
};
GroupedGemmResources& grouped_gemm_resources();

}  // namespace fp8tron::fp8
