// Fused residual add + LayerNorm / RMSNorm kernels. A row is spread over one group of threads
// (threadIdx.y picks the group, blockDim.x threads per row, a multiple of 32), each thread holding
// up to 16 of its values in registers as packs of V elements: 16-byte packs when the hidden size
// and every pointer allow it, else single elements. The statistics are two-pass over the
// registers (mean, then the mean square about it) in fp32; row sums reduce in a fixed order, so
// every run gives the same bits.
//   forward:  reads residual and branch (and the branch's pending bias), writes sum and normed
//             (the unfused chain wrote the sum, then read it for the norm's statistics and again
//             for its output);
//   backward: reads d_normed, d_sum and the saved sum, writes d_in = d_sum + the norm's input
//             gradient (the unfused chain wrote the norm's input gradient and autograd then added
//             it to d_sum in a separate kernel), and accumulates the parameter gradients of the
//             block's rows in registers (and the branch bias's: the sum of d_in); one partial
//             row per block, summed by a second kernel;
//             asked, it also writes the norm's output again (for a GEMM's weight gradient), with
//             the forward's arithmetic.

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "core/cuda/packed_access.cuh"
#include "core/cuda/warp_reduce.cuh"
#include "models/norm/residual_norm_kernels.h"

namespace fp8tron::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxThreadsPerRow = 512;
constexpr int kMaxValuesPerThread = 16;  // 512 x 16 = kResidualNormMaxHidden
static_assert(int64_t(kMaxThreadsPerRow) * kMaxValuesPerThread == kResidualNormMaxHidden);
constexpr int kBlockThreads = 512;  // the most threads of a block (a row takes up to 512)
constexpr int kMaxRowsPerBlock = kBlockThreads / kWarp;
// Rows share a block up to these many threads. The backward kernel holds more registers per thread
// (about 80 with one 16-byte pack each of the sum, d_normed and d_sum and 16 fp32 parameter
// gradient sums): smaller blocks fit more warps in an SM's register file.
constexpr int kForwardBlockTarget = 512;
constexpr int kBackwardBlockTarget = 256;
constexpr int kMaxThreadsPerSm = 2048;


// The sum of v[i] over the threads of this thread's row group, the same bits in every thread: an
// xor butterfly within each warp (each step adds the same two partial sums in every lane), then
// the warps' sums in warp order. Every thread of the block must call it: it synchronizes.
// `scratch` holds kMaxRowsPerBlock x 32 x N floats.
template <int N>
__device__ __forceinline__ void row_sum(float (&v)[N], float* scratch) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = warp_sum<kWarp>(v[i]);
  float* group = scratch + threadIdx.y * kWarp * N;
  const int warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  if (threadIdx.x % kWarp == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) group[warp * N + i] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += group[w * N + i];
    v[i] = total;
  }
  __syncthreads();  // scratch is free again
}

// One output value of the norm, in fp32 before its rounding: xhat * gamma (+ beta), with xhat =
// (x - mean) * rstd. Explicitly rounded operations (no fused multiply-add the compiler may or may
// not form): the backward's rewrite of the output must give the forward's bits.
__device__ __forceinline__ float normalized(float x, float mean, float rstd, float gamma, float gamma_offset) {
  return __fmul_rn(__fmul_rn(__fsub_rn(x, mean), rstd), __fadd_rn(gamma, gamma_offset));
}
__device__ __forceinline__ float shifted(float y, float beta) { return __fadd_rn(y, beta); }

template <class T>
struct ForwardArgs {
  const T* residual;
  const T* branch;  // null: norm of residual alone, no sum written
  const T* branch_bias;  // null: none; else added to branch (rounded) before the residual
  const T* gamma;
  const T* beta;    // null: none
  T* sum;
  T* normed;
  float* mean;      // null: RMSNorm
  float* rstd;
  int64_t rows;
  int hidden;
  float epsilon, gamma_offset;
};

template <class T, int V, int kPacks>
__global__ void __launch_bounds__(kBlockThreads) residual_norm_forward_kernel(const ForwardArgs<T> a) {
  using P = Pack<T, V>;
  __shared__ float scratch[kMaxRowsPerBlock * kWarp];
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool valid = row < a.rows;  // groups past the last row still take part in the row sums
  const bool rms = a.mean == nullptr;
  const int packs = a.hidden / V;
  const int64_t start = row * a.hidden;
  const float inv_hidden = 1.0f / float(a.hidden);

  P x[kPacks];
  float total[1] = {0.0f};  // sum of x (LayerNorm) or of x^2 (RMSNorm)
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (!valid || p >= packs) continue;
    const int64_t at = start + int64_t(p) * V;
    x[k] = load<P>(a.residual + at);
    if (a.branch) {
      // Rounded to T before the statistics, as the unfused chain's add stored it.
      P b = load<P>(a.branch + at);
      if (a.branch_bias) {
        // branch + bias rounded first, as the unfused residual + (branch + bias) rounds it.
        const P bias = load<P>(a.branch_bias + p * V);
#pragma unroll
        for (int j = 0; j < V; ++j) b.v[j] = from_float<T>(to_float(b.v[j]) + to_float(bias.v[j]));
      }
#pragma unroll
      for (int j = 0; j < V; ++j) x[k].v[j] = from_float<T>(to_float(x[k].v[j]) + to_float(b.v[j]));
      store(a.sum + at, x[k]);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float v = to_float(x[k].v[j]);
      total[0] += rms ? v * v : v;
    }
  }
  row_sum(total, scratch);

  float mean = 0.0f, rstd;
  if (rms) {
    rstd = rsqrtf(total[0] * inv_hidden + a.epsilon);
  } else {
    mean = total[0] * inv_hidden;
    float squares[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (!valid || p >= packs) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float d = to_float(x[k].v[j]) - mean;
        squares[0] += d * d;
      }
    }
    row_sum(squares, scratch);
    rstd = rsqrtf(squares[0] * inv_hidden + a.epsilon);
  }
  if (!valid) return;  // no synchronization below
  if (threadIdx.x == 0) {
    if (a.mean) a.mean[row] = mean;
    a.rstd[row] = rstd;
  }
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (p >= packs) continue;
    const P g = load<P>(a.gamma + p * V);
    P b;
    if (a.beta) b = load<P>(a.beta + p * V);
    P out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float y = normalized(to_float(x[k].v[j]), mean, rstd, to_float(g.v[j]), a.gamma_offset);
      if (a.beta) y = shifted(y, to_float(b.v[j]));
      out.v[j] = from_float<T>(y);
    }
    store(a.normed + start + int64_t(p) * V, out);
  }
}

template <class T>
struct BackwardArgs {
  const T* d_normed;
  const T* d_sum;  // null: zero
  const T* sum;
  const T* gamma;
  const T* beta;      // null: none (only read for `normed`)
  const float* mean;  // null: RMSNorm
  const float* rstd;
  T* d_in;
  T* normed;          // null: the norm's output is not written again
  float* d_gamma_part;  // [gridDim.x, hidden], null: no gamma gradient
  float* d_beta_part;   // null: no beta gradient
  float* d_branch_bias_part;  // [gridDim.x, hidden], null: no branch bias gradient
  int64_t rows;
  int hidden;
  float gamma_offset;
};

// The block's partial sums of one parameter gradient: each row group's values of its columns go to
// shared memory, then group 0 adds them up in group order into the block's partial row.
template <int V, int kPacks>
__device__ __forceinline__ void write_block_partial(const float (&v)[kPacks][V], float* columns, float* out_row,
                                                    int packs, int hidden) {
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (p >= packs) continue;
#pragma unroll
    for (int j = 0; j < V; ++j) columns[threadIdx.y * hidden + p * V + j] = v[k][j];
  }
  __syncthreads();
  if (threadIdx.y == 0) {
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (p >= packs) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int c = p * V + j;
        float total = 0.0f;
        for (int g = 0; g < int(blockDim.y); ++g) total += columns[g * hidden + c];
        out_row[c] = total;
      }
    }
  }
  __syncthreads();  // columns is free again
}

// The norm's output of one pack, as the forward kernel wrote it.
template <class T, int V>
__device__ __forceinline__ void rewrite_normed(const BackwardArgs<T>& a, const Pack<T, V>& x, const Pack<T, V>& gamma,
                                               float mean, float rstd, int64_t start, int p) {
  Pack<T, V> beta, out;
  if (a.beta) beta = load<Pack<T, V>>(a.beta + p * V);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float y = normalized(to_float(x.v[j]), mean, rstd, to_float(gamma.v[j]), a.gamma_offset);
    if (a.beta) y = shifted(y, to_float(beta.v[j]));
    out.v[j] = from_float<T>(y);
  }
  store(a.normed + start + int64_t(p) * V, out);
}

// With xhat = (x - mean) rstd and g = gamma (+ 1 when zero-centred), the norm's input gradient is
//   LayerNorm: rstd (dy g - mean(dy g) - xhat mean(dy g xhat))
//   RMSNorm:   rstd (dy g - xhat mean(dy g xhat))            (mean = 0)
// and the parameters' gradients are sum over rows of dy xhat (gamma) and dy (beta).
template <class T, int V, int kPacks>
__global__ void __launch_bounds__(kBlockThreads) residual_norm_backward_kernel(const BackwardArgs<T> a) {
  using P = Pack<T, V>;
  __shared__ float scratch[kMaxRowsPerBlock * kWarp * 2];
  extern __shared__ float columns[];  // blockDim.y x hidden, with parameter gradients
  const bool rms = a.mean == nullptr;
  const int packs = a.hidden / V;
  const float inv_hidden = 1.0f / float(a.hidden);

  // Gamma is read where it is used (cached): as registers held across rows it cost occupancy.
  float d_gamma[kPacks][V], d_beta[kPacks][V], d_branch_bias[kPacks][V];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
#pragma unroll
    for (int j = 0; j < V; ++j) d_gamma[k][j] = d_beta[k][j] = d_branch_bias[k][j] = 0.0f;
  }

  // Every group runs the same number of iterations (the row sums synchronize the block).
  const int64_t step = int64_t(gridDim.x) * blockDim.y;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.y; base < a.rows; base += step) {
    const int64_t row = base + threadIdx.y;
    const bool valid = row < a.rows;
    const int64_t start = row * a.hidden;
    const float mean = valid && !rms ? a.mean[row] : 0.0f;
    const float rstd = valid ? a.rstd[row] : 0.0f;
    P x[kPacks], dy[kPacks], residual_grad[kPacks];  // all three loads in flight before the row sums
    float sums[2] = {0.0f, 0.0f};  // sum of dy g, sum of dy g xhat
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (!valid || p >= packs) continue;
      const int64_t at = start + int64_t(p) * V;
      x[k] = load<P>(a.sum + at);
      dy[k] = load<P>(a.d_normed + at);
      if (a.d_sum) residual_grad[k] = load<P>(a.d_sum + at);
      const P gamma = load<P>(a.gamma + p * V);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float xhat = (to_float(x[k].v[j]) - mean) * rstd;
        const float dyg = to_float(dy[k].v[j]) * (to_float(gamma.v[j]) + a.gamma_offset);
        sums[0] += dyg;
        sums[1] += dyg * xhat;
      }
    }
    row_sum(sums, scratch);
    const float mean_dyg = rms ? 0.0f : sums[0] * inv_hidden, mean_dyg_xhat = sums[1] * inv_hidden;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = threadIdx.x + k * blockDim.x;
      if (!valid || p >= packs) continue;
      const int64_t at = start + int64_t(p) * V;
      const P gamma = load<P>(a.gamma + p * V);
      if (a.normed) rewrite_normed(a, x[k], gamma, mean, rstd, start, p);
      P out;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float xhat = (to_float(x[k].v[j]) - mean) * rstd;
        const float d = to_float(dy[k].v[j]);
        const float dyg = d * (to_float(gamma.v[j]) + a.gamma_offset);
        float dx = rstd * (dyg - mean_dyg - xhat * mean_dyg_xhat);
        // The norm's gradient is rounded before the residual's is added, as the unfused chain (the
        // norm's backward, then autograd's add) rounds it: a norm whose add ran apart (a
        // recomputed unit's boundary, a recomputed MLP) gives the same bits.
        if (a.d_sum) dx = to_float(from_float<T>(dx)) + to_float(residual_grad[k].v[j]);
        out.v[j] = from_float<T>(dx);
        d_gamma[k][j] += d * xhat;
        d_beta[k][j] += d;
        d_branch_bias[k][j] += to_float(out.v[j]);  // the branch's gradient as stored
      }
      store(a.d_in + at, out);
    }
  }
  // Each condition is uniform over the block.
  const int64_t row_of_block = int64_t(blockIdx.x) * a.hidden;
  if (a.d_gamma_part) write_block_partial(d_gamma, columns, a.d_gamma_part + row_of_block, packs, a.hidden);
  if (a.d_beta_part) write_block_partial(d_beta, columns, a.d_beta_part + row_of_block, packs, a.hidden);
  if (a.d_branch_bias_part)
    write_block_partial(d_branch_bias, columns, a.d_branch_bias_part + row_of_block, packs, a.hidden);
}

// The partial rows to sum (gamma's, beta's, the branch bias's; null: none) and where each total
// goes.
struct ReducePartialsArgs {
  const float* part[3];
  SummedGradOut out[3];
  int64_t parts;
  int hidden;
};

// out[c] = the sum of part[i, c] over the `parts` partial rows: 32 columns per block, thread y
// adding rows y, y + 32, ... in order, then the 32 subtotals in order. blockIdx.y picks gamma's
// (0), beta's (1) or the branch bias's (2) partials.
template <class T>
__global__ void __launch_bounds__(kWarp * kWarp) residual_norm_reduce_partials_kernel(const ReducePartialsArgs a) {
  __shared__ float subtotal[kWarp][kWarp + 1];
  const float* part = a.part[blockIdx.y];
  if (part == nullptr) return;  // uniform over the block
  const int c = blockIdx.x * kWarp + threadIdx.x;
  float total = 0.0f;
  if (c < a.hidden)
    for (int64_t i = threadIdx.y; i < a.parts; i += kWarp) total += part[i * a.hidden + c];
  subtotal[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y != 0 || c >= a.hidden) return;
  float sum = 0.0f;
  for (int i = 0; i < kWarp; ++i) sum += subtotal[i][threadIdx.x];
  const SummedGradOut& out = a.out[blockIdx.y];
  if (!out.fp32) {
    static_cast<T*>(out.data)[c] = from_float<T>(sum);
  } else {
    float* total = static_cast<float*>(out.data);
    total[c] = out.accumulate ? total[c] + sum : sum;
  }
}

// How a row is spread: one pack per thread up to 512 threads, then ceil(packs / 512) per thread
// (the kernel instance holds the next power of two), the threads rounded up to whole warps; and
// as many rows per block as fit `block_target` threads.
struct Layout {
  int packs_per_thread;
  int threads_per_row;
  int rows_per_block;
  int threads() const { return threads_per_row * rows_per_block; }
};
Layout layout_for(int64_t hidden, int V, int block_target) {
  const int packs = int(hidden / V);
  const int per_thread = (packs + kMaxThreadsPerRow - 1) / kMaxThreadsPerRow;
  const int threads = (packs + per_thread - 1) / per_thread;
  const int per_row = (threads + kWarp - 1) / kWarp * kWarp;
  return {per_thread, per_row, std::max(1, block_target / per_row)};
}
template <class T>
constexpr int kVector = int(16 / sizeof(T));
int sm_count() {
  int device = 0, sms = 0;
  FP8TRON_CUDA_CHECK(cudaGetDevice(&device));
  FP8TRON_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}
// The backward grid: the blocks that fit the device at once (the kernel loops over the rest of the
// rows), no more than there are row groups. With parameter gradients each block writes one
// partial row, so the workspace holds at most max_backward_blocks rows.
int64_t max_backward_blocks(int64_t rows, const Layout& l, int sms) {
  return std::max<int64_t>(1, std::min<int64_t>((rows + l.rows_per_block - 1) / l.rows_per_block,
                                                int64_t(sms) * (kMaxThreadsPerSm / l.threads())));
}

template <class T>
bool can_vectorize(int64_t hidden, std::initializer_list<const void*> pointers) {
  bool ok = hidden % (16 / sizeof(T)) == 0;
  for (const void* p : pointers) ok = ok && reinterpret_cast<uintptr_t>(p) % 16 == 0;  // null passes
  return ok;
}

unsigned ceil_div(int64_t a, int64_t b) { return unsigned((a + b - 1) / b); }

template <class T, int V, int kPacks>
void launch_forward_as(const ForwardArgs<T>& a, cudaStream_t stream) {
  const Layout l = layout_for(a.hidden, V, kForwardBlockTarget);
  const dim3 block(l.threads_per_row, l.rows_per_block);
  residual_norm_forward_kernel<T, V, kPacks><<<ceil_div(a.rows, l.rows_per_block), block, 0, stream>>>(a);
  FP8TRON_CUDA_CHECK_LAUNCH("residual_norm_forward_kernel");
}

// Returns the grid: the number of partial rows written.
template <class T, int V, int kPacks>
int64_t launch_backward_as(const BackwardArgs<T>& a, cudaStream_t stream) {
  const Layout l = layout_for(a.hidden, V, kBackwardBlockTarget);
  const dim3 block(l.threads_per_row, l.rows_per_block);
  const bool partials = a.d_gamma_part || a.d_beta_part || a.d_branch_bias_part;
  const size_t shared = partials ? size_t(l.rows_per_block) * a.hidden * sizeof(float) : 0;
  int resident = 0;
  FP8TRON_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, residual_norm_backward_kernel<T, V, kPacks>,
                                                                   l.threads(), shared));
  const int sms = sm_count();
  const int64_t grid = std::min<int64_t>(max_backward_blocks(a.rows, l, sms), int64_t(sms) * std::max(resident, 1));
  residual_norm_backward_kernel<T, V, kPacks><<<unsigned(grid), block, shared, stream>>>(a);
  FP8TRON_CUDA_CHECK_LAUNCH("residual_norm_backward_kernel");
  return grid;
}

// Calls launch with the kernel instance for the row: 16-byte packs with the fewest registers per
// thread that hold the row, or single elements (up to 16 per thread).
template <class T, class Launch>
auto dispatch(bool vectorized, int64_t hidden, int block_target, Launch launch) {
  using One = std::integral_constant<int, 1>;
  using Vector = std::integral_constant<int, kVector<T>>;
  if (!vectorized) return launch(One{}, std::integral_constant<int, kMaxValuesPerThread>{});
  const int per_thread = layout_for(hidden, kVector<T>, block_target).packs_per_thread;
  if (per_thread == 1) return launch(Vector{}, One{});
  if (per_thread == 2) return launch(Vector{}, std::integral_constant<int, 2>{});
  return launch(Vector{}, std::integral_constant<int, kMaxValuesPerThread / kVector<T>>{});
}

void check_shape(const ResidualNormShape& s) {
  FP8TRON_CHECK(s.hidden >= 1 && s.hidden <= kResidualNormMaxHidden,
                "residual norm kernels take hidden sizes 1.." + std::to_string(kResidualNormMaxHidden) + ", got " +
                    std::to_string(s.hidden));
}

template <class T>
void forward_typed(const ResidualNormShape& s, const ResidualNormForwardIo& io, cudaStream_t stream) {
  check_shape(s);
  if (s.rows == 0) return;
  FP8TRON_CHECK(s.rms || io.mean != nullptr, "LayerNorm needs somewhere to save the means");
  FP8TRON_CHECK(io.branch_bias == nullptr || io.branch != nullptr, "a branch bias needs a branch");
  const ForwardArgs<T> a{static_cast<const T*>(io.residual),
                         static_cast<const T*>(io.branch),
                         static_cast<const T*>(io.branch_bias),
                         static_cast<const T*>(io.gamma),
                         s.rms ? nullptr : static_cast<const T*>(io.beta),
                         io.branch ? static_cast<T*>(io.sum) : nullptr,
                         static_cast<T*>(io.normed),
                         s.rms ? nullptr : io.mean,
                         io.rstd,
                         s.rows,
                         int(s.hidden),
                         s.epsilon,
                         s.gamma_offset};
  const bool vectorized =
      can_vectorize<T>(s.hidden, {a.residual, a.branch, a.branch_bias, a.gamma, a.beta, a.sum, a.normed});
  dispatch<T>(vectorized, s.hidden, kForwardBlockTarget, [&](auto v, auto packs) {
    launch_forward_as<T, decltype(v)::value, decltype(packs)::value>(a, stream);
  });
}

template <class T>
void backward_typed(const ResidualNormShape& s, const ResidualNormBackwardIo& io, cudaStream_t stream) {
  check_shape(s);
  FP8TRON_CHECK(s.rms || io.mean != nullptr || s.rows == 0, "LayerNorm's backward needs the saved means");
  const bool gamma = io.d_gamma.data != nullptr, beta = io.d_beta.data != nullptr && !s.rms;
  const bool branch_bias = io.d_branch_bias.data != nullptr;
  const bool sums = gamma || beta || branch_bias;
  FP8TRON_CHECK(!sums || (io.workspace && io.workspace_rows >= 1), "the parameter gradients need the workspace");
  FP8TRON_CHECK(!branch_bias || io.d_branch_bias.fp32, "the branch bias's gradient is summed in fp32");
  for (const SummedGradOut* out : {&io.d_gamma, &io.d_beta, &io.d_branch_bias})
    FP8TRON_CHECK(out->fp32 || !out->accumulate, "only an fp32 gradient can be added to");
  // The workspace's three blocks of workspace_rows partial rows: gamma's, beta's, the branch bias's.
  const auto block = [&](int i) { return io.workspace + i * io.workspace_rows * s.hidden; };
  float* gamma_part = gamma ? block(0) : nullptr;
  float* beta_part = beta ? block(1) : nullptr;
  float* branch_bias_part = branch_bias ? block(2) : nullptr;
  int64_t parts = 0;
  if (s.rows > 0) {
    const BackwardArgs<T> a{static_cast<const T*>(io.d_normed), static_cast<const T*>(io.d_sum),
                            static_cast<const T*>(io.sum),      static_cast<const T*>(io.gamma),
                            s.rms ? nullptr : static_cast<const T*>(io.beta),
                            s.rms ? nullptr : io.mean,          io.rstd,
                            static_cast<T*>(io.d_in),           static_cast<T*>(io.normed),
                            gamma_part,                         beta_part,
                            branch_bias_part,                   s.rows,
                            int(s.hidden),                      s.gamma_offset};
    const bool vectorized =
        can_vectorize<T>(s.hidden, {a.d_normed, a.d_sum, a.sum, a.gamma, a.beta, a.d_in, a.normed});
    parts = dispatch<T>(vectorized, s.hidden, kBackwardBlockTarget, [&](auto v, auto packs) {
      return launch_backward_as<T, decltype(v)::value, decltype(packs)::value>(a, stream);
    });
    FP8TRON_CHECK(!sums || parts <= io.workspace_rows, "the backward grid outgrew its workspace");
  }
  if (!sums) return;
  // With no rows (parts 0) the totals are zero.
  const ReducePartialsArgs r{{gamma_part, beta_part, branch_bias_part},
                             {io.d_gamma, io.d_beta, io.d_branch_bias},
                             parts,
                             int(s.hidden)};
  const dim3 grid(ceil_div(s.hidden, kWarp), branch_bias ? 3 : beta ? 2 : 1), threads(kWarp, kWarp);
  residual_norm_reduce_partials_kernel<T><<<grid, threads, 0, stream>>>(r);
  FP8TRON_CUDA_CHECK_LAUNCH("residual_norm_reduce_partials_kernel");
}

}  // namespace

void residual_norm_forward(const ResidualNormShape& s, const ResidualNormForwardIo& io, cudaStream_t stream) {
  switch (s.dtype) {
    case FloatType::kFloat32: return forward_typed<float>(s, io, stream);
    case FloatType::kBFloat16: return forward_typed<__nv_bfloat16>(s, io, stream);
    case FloatType::kFloat16: return forward_typed<__half>(s, io, stream);
  }
}

int64_t residual_norm_workspace_rows(const ResidualNormShape& s) {
  check_shape(s);
  const int sms = sm_count();
  // Either kernel instance may run (16-byte packs or single elements, by the pointers' alignment).
  auto blocks = [&](int V) { return max_backward_blocks(s.rows, layout_for(s.hidden, V, kBackwardBlockTarget), sms); };
  const int V = s.dtype == FloatType::kFloat32 ? kVector<float> : kVector<__half>;
  return std::max(blocks(1), s.hidden % V == 0 ? blocks(V) : 1);
}

void residual_norm_backward(const ResidualNormShape& s, const ResidualNormBackwardIo& io, cudaStream_t stream) {
  switch (s.dtype) {
    case FloatType::kFloat32: return backward_typed<float>(s, io, stream);
    case FloatType::kBFloat16: return backward_typed<__nv_bfloat16>(s, io, stream);
    case FloatType::kFloat16: return backward_typed<__half>(s, io, stream);
  }
}

}  // namespace fp8tron::kernels
