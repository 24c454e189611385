#include "fp8/wgrad_fusion.h"

#include <atomic>

namespace fp8tron {
namespace {
std::atomic<bool> fusion_on{true};
}

bool gradient_accumulation_fusion() { return fusion_on.load(std::memory_order_relaxed); }
void set_gradient_accumulation_fusion(bool on) { fusion_on.store(on, std::memory_order_relaxed); }

}  // namespace fp8tron
