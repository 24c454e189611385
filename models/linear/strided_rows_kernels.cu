#include "models/linear/strided_rows_kernels.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/cuda/cuda_check.h"

namespace fp8tron::kernels {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill an H100 / H200 several times over; the loop strides over the rest.
constexpr int64_t kMaxBlocks = 8192;

// Offsets in units of T (a 16-byte vector or one element); `units` per row. I is the index type:
// 32-bit whenever every offset fits, as 64-bit division costs more than the copy itself.
template <typename T, typename I>
__global__ void copy_rows_kernel(const T* __restrict__ src, T* __restrict__ dst, StridedRows layout, I units, I total) {
  const I s1 = I(layout.sizes[1]), s2 = I(layout.sizes[2]), s3 = I(layout.sizes[3]);
  const I src0 = I(layout.src_strides[0]), src1 = I(layout.src_strides[1]), src2 = I(layout.src_strides[2]),
          src3 = I(layout.src_strides[3]);
  const I dst0 = I(layout.dst_strides[0]), dst1 = I(layout.dst_strides[1]), dst2 = I(layout.dst_strides[2]),
          dst3 = I(layout.dst_strides[3]);
  for (I idx = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); idx < total; idx += I(gridDim.x) * I(blockDim.x)) {
    I row = idx / units;
    const I u = idx - row * units;
    const I c3 = row % s3;
    row /= s3;
    const I c2 = row % s2;
    row /= s2;
    const I c1 = row % s1;
    const I c0 = row / s1;
    dst[u + c0 * dst0 + c1 * dst1 + c2 * dst2 + c3 * dst3] = src[u + c0 * src0 + c1 * src1 + c2 * src2 + c3 * src3];
  }
}

// The furthest element (in units) either layout reaches, plus one.
int64_t extent(const StridedRows& l, int64_t units, const int64_t* strides) {
  int64_t end = units;
  for (int d = 0; d < 4; ++d) end += (l.sizes[d] - 1) * strides[d];
  return end;
}

template <typename T>
void launch(const void* src, void* dst, StridedRows layout, int64_t units, cudaStream_t stream) {
  int64_t rows = 1;
  for (int64_t s : layout.sizes) rows *= s;
  const int64_t total = rows * units;
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks);
  const auto* in = static_cast<const T*>(src);
  auto* out = static_cast<T*>(dst);
  constexpr int64_t kInt32Limit = (int64_t{1} << 31) - 1;
  // The grid-stride loop's last index may pass `total` by up to a grid's worth of threads.
  const bool narrow = total + blocks * kThreads < kInt32Limit && extent(layout, units, layout.src_strides) < kInt32Limit &&
                      extent(layout, units, layout.dst_strides) < kInt32Limit;
  if (narrow)
    copy_rows_kernel<T, uint32_t><<<unsigned(blocks), kThreads, 0, stream>>>(in, out, layout, uint32_t(units), uint32_t(total));
  else
    copy_rows_kernel<T, uint64_t><<<unsigned(blocks), kThreads, 0, stream>>>(in, out, layout, uint64_t(units), uint64_t(total));
}

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % uintptr_t(bytes) == 0; }

// Whether every row starts on a `bytes` boundary in both layouts.
bool vectorizable(const void* src, const void* dst, const StridedRows& l, int64_t bytes) {
  if ((l.row_elems * l.elem_bytes) % bytes || !aligned(src, bytes) || !aligned(dst, bytes)) return false;
  for (int d = 0; d < 4; ++d)
    if ((l.src_strides[d] * l.elem_bytes) % bytes || (l.dst_strides[d] * l.elem_bytes) % bytes) return false;
  return true;
}

// The layout's strides in units of `unit_bytes`.
StridedRows in_units(StridedRows l, int64_t unit_bytes) {
  for (int d = 0; d < 4; ++d) {
    l.src_strides[d] = l.src_strides[d] * l.elem_bytes / unit_bytes;
    l.dst_strides[d] = l.dst_strides[d] * l.elem_bytes / unit_bytes;
  }
  return l;
}

}  // namespace

void copy_strided_rows(const void* src, void* dst, const StridedRows& layout, cudaStream_t stream) {
  const int64_t row_bytes = layout.row_elems * layout.elem_bytes;
  if (vectorizable(src, dst, layout, 16)) {
    launch<uint4>(src, dst, in_units(layout, 16), row_bytes / 16, stream);
  } else if (layout.elem_bytes == 4) {
    launch<uint32_t>(src, dst, layout, layout.row_elems, stream);
  } else if (layout.elem_bytes == 2) {
    launch<uint16_t>(src, dst, layout, layout.row_elems, stream);
  } else {
    throw std::invalid_argument("copy_strided_rows: element size " + std::to_string(layout.elem_bytes) +
                                " (2 or 4 bytes supported)");
  }
  FP8TRON_CUDA_CHECK_LAUNCH("copy_strided_rows");
}

}  // namespace fp8tron::kernels
