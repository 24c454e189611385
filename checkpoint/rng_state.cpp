#include "checkpoint/rng_state.h"

#include <ATen/Context.h>

#include <cstring>
#include <mutex>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "checkpoint/model_identity.h"

namespace fp8tron {
namespace ck = checkpoint;

std::string generator_state(const torch::Device& device) {
  at::Generator g = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  torch::Tensor state = g.get_state().contiguous();
  return std::string(static_cast<const char*>(state.data_ptr()), size_t(state.numel() * state.element_size()));
}

std::vector<std::string> generator_fields(const torch::Device& device) {
  std::vector<std::string> fields = {"cpu", generator_state(torch::Device(torch::kCPU))};
  if (device.is_cuda()) fields.insert(fields.end(), {"cuda", generator_state(device)});
  return fields;
}

void set_generator_state(const torch::Device& device, const std::string& bytes, const std::string& source) {
  at::Generator g = at::globalContext().defaultGenerator(device);
  auto state = torch::empty({int64_t(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
  try {
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state);
  } catch (const c10::Error& e) {
    throw UserError(strprintf("%s: the %s RNG state cannot be restored (%s)", source.c_str(), device.str().c_str(),
                              e.what_without_backtrace()));
  }
}

void restore_rng(const ck::CheckpointMetadata& m, const TrainingState& s, const std::string& path) {
  if (m.rng.empty())
    throw UserError("checkpoint " + path + " holds no RNG state (saved with --no-save-rng); pass --no-load-rng to "
                    "continue with the RNG seeded from --seed");
  restore_rng_states(m.rng, m.parallel, s, path);
}

void restore_rng_states(const std::vector<ck::RngState>& states, const ck::ParallelLayout& saved, const TrainingState& s,
                        const std::string& path) {
  const ck::ParallelLayout here = layout_of(s);
  if (!(saved == here)) {
    log::info(" > RNG states not restored: the checkpoint's layout " + layout_string(saved) + " differs from " +
              layout_string(here) + "; random streams (dropout) continue from --seed");
    return;
  }
  bool cuda_restored = false;
  for (const auto& r : states) {
    if (r.rank != s.parallel.world_rank) continue;
    if (r.name == "cpu") set_generator_state(torch::Device(torch::kCPU), r.state, path);
    if (r.name == "cuda" && s.device.is_cuda()) {
      set_generator_state(s.device, r.state, path);
      cuda_restored = true;
    }
  }
  if (s.device.is_cuda() && !cuda_restored)
    log::info(" > the checkpoint holds no CUDA RNG state (saved on the CPU?); the CUDA generator continues from --seed");
}

}  // namespace fp8tron
