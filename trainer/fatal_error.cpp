#include "trainer/fatal_error.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <new>

#include "core/error.h"

namespace fp8tron {
namespace {

const char* kFitHint =
    "to fit: lower --micro-batch-size (--global-batch-size stays, more micro-batches accumulate), recompute "
    "activations (--recompute-activations, or --recompute-granularity full --recompute-method uniform "
    "--recompute-num-layers 1), shard the optimizer (--use-distributed-optimizer) or the model "
    "(--tensor-model-parallel-size, --pipeline-model-parallel-size), or split long sequences "
    "(--context-parallel-size)";

// LibTorch's messages run over several lines; the report is one.
std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

std::string on_rank(int rank) { return rank >= 0 ? " on rank " + std::to_string(rank) : ""; }

bool contains(const std::string& text, const char* needle) { return text.find(needle) != std::string::npos; }

// A c10::Error's what() carries a backtrace of LibTorch frames; FP8TRON_BACKTRACE=1 keeps it.
std::string message_of(const std::exception& e) {
  const char* keep = std::getenv("FP8TRON_BACKTRACE");
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e); c10_error && !(keep && *keep == '1'))
    return one_line(c10_error->what_without_backtrace());
  return one_line(e.what());
}

}  // namespace

FatalReport report_fatal_error(const std::exception& e, int rank) {
  if (dynamic_cast<const UserError*>(&e)) return {std::string("fp8tron: error: ") + e.what(), 1};
  const std::string message = message_of(e);
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) || contains(message, "cudaErrorMemoryAllocation") ||
      contains(message, "CUDA error: out of memory") || contains(message, "CUBLAS_STATUS_ALLOC_FAILED") ||
      contains(message, "CUDNN_STATUS_ALLOC_FAILED"))
    return {"fp8tron: error: out of GPU memory" + on_rank(rank) + " (" + message + "); " + kFitHint, 1};
  if (dynamic_cast<const std::bad_alloc*>(&e) || contains(message, "DefaultCPUAllocator: can't allocate memory"))
    return {"fp8tron: error: out of host memory" + on_rank(rank) + " (" + message + "); " + kFitHint, 1};
  const char* keep = std::getenv("FP8TRON_BACKTRACE");
  const bool has_backtrace = dynamic_cast<const c10::Error*>(&e) != nullptr && !(keep && *keep == '1');
  return {"fp8tron: internal error" + on_rank(rank) + ": " + message +
              (has_backtrace ? " (FP8TRON_BACKTRACE=1 prints LibTorch's backtrace)" : ""),
          2};
}

}  // namespace fp8tron
