// The fused AdamW kernel (optim/adamw_kernels.h): one grid-stride pass over a segment.
// Elements go in packs of four (16-byte fp32 loads and stores, the model copy's four values and bf16
// moments' four values as one 8-byte access) from the first 16-byte boundary of p; the few elements
// before it and after the last whole pack, or every element when g, m or v do not share p's
// alignment, go one by one. The grid is the number of blocks the GPU holds at once, so each thread
// streams through many packs with no tail wave.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "core/cuda/cuda_check.h"
#include "optim/adamw_kernels.h"
#include "optim/adamw_math.cuh"

namespace fp8tron::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kPack = 4;  // fp32 elements per 16-byte access

struct Args {
  float* p;
  const float* g;
  void* m;  // fp32 or bf16 (the kernel's M)
  void* v;
  void* copy;
  int64_t n;
  AdamWDeviceScalars scalars;
  AdamWFloats hyper;
};

// Adam moments of storage type M: fp32 as is, bf16 widened exactly on load and rounded to
// nearest-even on store (the math in between is fp32 either way).
template <class M>
__device__ __forceinline__ float load_moment(const void* base, int64_t i) {
  if constexpr (std::is_same_v<M, float>) return static_cast<const float*>(base)[i];
  else return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}
template <class M>
__device__ __forceinline__ void store_moment(void* base, int64_t i, float value) {
  static_cast<M*>(base)[i] = rounded<M>(value);
}

// Four model-copy values as one store, 16 bytes for fp32, 8 for bf16 / fp16, through __stwb (an
// explicit st.global.v4 / v2): as a plain assignment nvcc splits this fourth store of the loop into
// element stores.
__device__ __forceinline__ unsigned bits_of(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ unsigned bits_of(__half v) { return __half_as_ushort(v); }
template <class C>
__device__ __forceinline__ void store_pack(C* dst, const float4& p) {
  if constexpr (std::is_same_v<C, float>) {
    __stwb(reinterpret_cast<float4*>(dst), p);
  } else {
    const uint2 words = make_uint2(bits_of(rounded<C>(p.x)) | bits_of(rounded<C>(p.y)) << 16,
                                   bits_of(rounded<C>(p.z)) | bits_of(rounded<C>(p.w)) << 16);
    __stwb(reinterpret_cast<uint2*>(dst), words);
  }
}

// The bf16 in the low 16 bits of a word, widened.
__device__ __forceinline__ float low_bf16(unsigned bits) {
  return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(bits & 0xffffu)));
}

// Four moments from element i (aligned to four of them): one 16-byte load for fp32, 8 for bf16.
template <class M>
__device__ __forceinline__ float4 load_moment_pack(const void* base, int64_t i) {
  if constexpr (std::is_same_v<M, float>) {
    return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
  } else {
    const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(base) + i);
    return make_float4(low_bf16(w.x), low_bf16(w.x >> 16), low_bf16(w.y), low_bf16(w.y >> 16));
  }
}
template <class M>
__device__ __forceinline__ void store_moment_pack(void* base, int64_t i, const float4& value) {
  if constexpr (std::is_same_v<M, float>) *reinterpret_cast<float4*>(static_cast<float*>(base) + i) = value;
  else store_pack(static_cast<M*>(base) + i, value);
}

// C: the model copy's element type (void: none). kPackedCopy: its packs are aligned for one store.
// M: the moments' storage type (float or __nv_bfloat16).
template <class C, bool kPackedCopy, class M>
__global__ void __launch_bounds__(kThreads) adamw_kernel(Args a, int64_t head, int64_t packs) {
  if (a.scalars.found_inf != nullptr && *a.scalars.found_inf != 0.0f) return;  // a skipped step: p, m, v and the copy stand
  const StepConstants c = step_constants(a.hyper, a.scalars);
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x, stride = int64_t(gridDim.x) * kThreads;
  // One by one: the head before the first pack and the tail after the last.
  const int64_t body_end = head + packs * kPack, loose = a.n - packs * kPack;
  for (int64_t k = first; k < loose; k += stride) {
    const int64_t i = k < head ? k : body_end + (k - head);
    float p = a.p[i], m = load_moment<M>(a.m, i), v = load_moment<M>(a.v, i);
    adamw_element(p, a.g[i], m, v, c);
    a.p[i] = p;
    store_moment<M>(a.m, i, m);
    store_moment<M>(a.v, i, v);
    store_copy<C>(a.copy, i, p);
  }
  for (int64_t k = first; k < packs; k += stride) {
    const int64_t i = head + k * kPack;
    float4 p = *reinterpret_cast<const float4*>(a.p + i);
    const float4 g = *reinterpret_cast<const float4*>(a.g + i);
    float4 m = load_moment_pack<M>(a.m, i);
    float4 v = load_moment_pack<M>(a.v, i);
    adamw_element(p.x, g.x, m.x, v.x, c);
    adamw_element(p.y, g.y, m.y, v.y, c);
    adamw_element(p.z, g.z, m.z, v.z, c);
    adamw_element(p.w, g.w, m.w, v.w, c);
    *reinterpret_cast<float4*>(a.p + i) = p;
    store_moment_pack<M>(a.m, i, m);
    store_moment_pack<M>(a.v, i, v);
    if constexpr (!std::is_void_v<C>) {
      if constexpr (kPackedCopy) {
        store_pack(static_cast<C*>(a.copy) + i, p);
      } else {
        store_copy<C>(a.copy, i, p.x);
        store_copy<C>(a.copy, i + 1, p.y);
        store_copy<C>(a.copy, i + 2, p.z);
        store_copy<C>(a.copy, i + 3, p.w);
      }
    }
  }
}

bool aligned(const void* p, int64_t byte_offset, int64_t alignment) {
  return (reinterpret_cast<uintptr_t>(p) + uintptr_t(byte_offset)) % uintptr_t(alignment) == 0;
}

// Blocks of `kernel` that the current device runs at once (cached per device and kernel).
int resident_blocks(const void* kernel) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, int> cache;
  int device = 0;
  FP8TRON_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = cache.try_emplace({device, kernel}, 0);
  if (inserted) {
    int sms = 0, per_sm = 0;
    FP8TRON_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    FP8TRON_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
    it->second = std::max(sms * std::max(per_sm, 1), 1);
  }
  return it->second;
}

template <class C, bool kPackedCopy, class M>
void launch(const Args& a, int64_t head, int64_t packs, cudaStream_t stream) {
  const auto kernel = adamw_kernel<C, kPackedCopy, M>;
  const int64_t work = std::max(packs, a.n - packs * kPack);
  const int64_t blocks = std::min<int64_t>((work + kThreads - 1) / kThreads, resident_blocks(reinterpret_cast<const void*>(kernel)));
  kernel<<<unsigned(blocks), kThreads, 0, stream>>>(a, head, packs);
  FP8TRON_CUDA_CHECK_LAUNCH("adamw_kernel");
}

// The copy's packs need 4 x sizeof(C) alignment at the first pack; otherwise its values go one by one.
template <class C, class M>
void launch_with_copy(const Args& a, int64_t head, int64_t packs, cudaStream_t stream) {
  const int64_t bytes = int64_t(sizeof(C));
  if (aligned(a.copy, head * bytes, bytes * kPack)) launch<C, true, M>(a, head, packs, stream);
  else launch<C, false, M>(a, head, packs, stream);
}

template <class M>
void launch_with_moments(const Args& a, ModelCopyType copy, int64_t head, int64_t packs, cudaStream_t stream) {
  switch (copy) {
    case ModelCopyType::kNone: return launch<void, true, M>(a, head, packs, stream);
    case ModelCopyType::kFloat32: return launch_with_copy<float, M>(a, head, packs, stream);
    case ModelCopyType::kBFloat16: return launch_with_copy<__nv_bfloat16, M>(a, head, packs, stream);
    case ModelCopyType::kFloat16: return launch_with_copy<__half, M>(a, head, packs, stream);
  }
}

}  // namespace

void fused_adamw(const AdamWSegment& s, const AdamWDeviceScalars& scalars, const AdamWHyperParams& h, cudaStream_t stream) {
  if (s.numel <= 0) return;
  const Args a{s.param, s.grad, s.exp_avg, s.exp_avg_sq, s.model_copy, s.numel, scalars, adamw_floats(h)};
  // Packs start where p reaches a 16-byte boundary; g, m and v must reach a pack boundary (16
  // bytes, 8 for bf16 moments) at the same element.
  int64_t head = std::min<int64_t>((16 - int64_t(reinterpret_cast<uintptr_t>(s.param) % 16)) % 16 / 4, s.numel);
  const int64_t at = head * int64_t(sizeof(float));
  const int64_t moment_bytes = s.moment_type == MomentType::kBFloat16 ? 2 : 4;
  int64_t packs = (s.numel - head) / kPack;
  if (!aligned(s.param, at, 16) || !aligned(s.grad, at, 16) || !aligned(s.exp_avg, head * moment_bytes, kPack * moment_bytes) ||
      !aligned(s.exp_avg_sq, head * moment_bytes, kPack * moment_bytes)) {
    head = s.numel;
    packs = 0;
  }
  const ModelCopyType copy = s.model_copy ? s.copy_type : ModelCopyType::kNone;
  if (s.moment_type == MomentType::kBFloat16) return launch_with_moments<__nv_bfloat16>(a, copy, head, packs, stream);
  launch_with_moments<float>(a, copy, head, packs, stream);
}

}  // namespace fp8tron::kernels
