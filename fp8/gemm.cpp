#include "fp8/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <functional>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "core/text.h"
#include "fp8/cuda_check.h"

#define FP8TRON_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                              \
    const cublasStatus_t fp8tron_status_ = (call);                                                  \
    if (fp8tron_status_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      ::fp8tron::throw_internal_error(__FILE__, __LINE__, __func__,                                 \
                                      std::string("cuBLASLt call failed: " #call ": ") +            \
                                          cublasLtGetStatusName(fp8tron_status_) + " (" +           \
                                          cublasLtGetStatusString(fp8tron_status_) + ")");          \
    }                                                                                               \
  } while (0)

namespace fp8tron::fp8 {

namespace {

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kE4M3: return CUDA_R_8F_E4M3;
    case DType::kE5M2: return CUDA_R_8F_E5M2;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kFP32: return CUDA_R_32F;
  }
  return CUDA_R_32F;
}

// Largest power of two (<= 256) dividing the address: cuBLASLt picks kernels by operand alignment.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && (a % align) != 0) align /= 2;
  return align;
}

// Everything that selects descriptors and the algorithm. Pointers are not part of it (set per
// call), only their alignments.
struct PlanKey {
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
  DType a_type{}, b_type{}, d_type{}, bias_type{};
  ScalingMode a_scaling{}, b_scaling{};
  bool trans_a = false, trans_b = false, fast_accum = false, has_bias = false, accumulate = false;
  int sm_count = 0;
  uint32_t align_a = 0, align_b = 0, align_d = 0;

  bool operator==(const PlanKey& o) const {
    return m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb && ldd == o.ldd && a_type == o.a_type &&
           b_type == o.b_type && d_type == o.d_type && bias_type == o.bias_type && a_scaling == o.a_scaling &&
           b_scaling == o.b_scaling && trans_a == o.trans_a && trans_b == o.trans_b && fast_accum == o.fast_accum &&
           has_bias == o.has_bias && accumulate == o.accumulate && sm_count == o.sm_count && align_a == o.align_a &&
           align_b == o.align_b && align_d == o.align_d;
  }

  std::string describe() const {
    return strprintf("m=%lld n=%lld k=%lld, A %s%s (%s, ld %lld), B %s%s (%s, ld %lld), D %s (ld %lld)%s%s%s",
                     static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                     dtype_name(a_type), trans_a ? "^T" : "", scaling_mode_name(a_scaling), static_cast<long long>(lda),
                     dtype_name(b_type), trans_b ? "^T" : "", scaling_mode_name(b_scaling), static_cast<long long>(ldb),
                     dtype_name(d_type), static_cast<long long>(ldd), fast_accum ? ", fast accumulation" : "",
                     has_bias ? ", bias" : "", accumulate ? ", accumulate" : "");
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<uint64_t>(k.m));
    mix(static_cast<uint64_t>(k.n));
    mix(static_cast<uint64_t>(k.k));
    mix(static_cast<uint64_t>(k.lda));
    mix(static_cast<uint64_t>(k.ldb));
    mix(static_cast<uint64_t>(k.ldd));
    mix((static_cast<uint64_t>(k.a_type) << 0) | (static_cast<uint64_t>(k.b_type) << 8) |
        (static_cast<uint64_t>(k.d_type) << 16) | (static_cast<uint64_t>(k.bias_type) << 24) |
        (static_cast<uint64_t>(k.a_scaling) << 32) | (static_cast<uint64_t>(k.b_scaling) << 40));
    mix((k.trans_a ? 1u : 0u) | (k.trans_b ? 2u : 0u) | (k.fast_accum ? 4u : 0u) | (k.has_bias ? 8u : 0u) |
        (k.accumulate ? 16u : 0u));
    mix(static_cast<uint64_t>(k.sm_count));
    mix((static_cast<uint64_t>(k.align_a) << 0) | (static_cast<uint64_t>(k.align_b) << 16) |
        (static_cast<uint64_t>(k.align_d) << 32));
    return h;
  }
};

cublasLtMatmulMatrixScale_t scale_mode(ScalingMode mode) {
  switch (mode) {
    case ScalingMode::kTensor: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case ScalingMode::kBlock1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case ScalingMode::kBlock128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    case ScalingMode::kMxfp8: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

// Descriptors, layouts and the chosen algorithm for one key. The per-call attributes (scale and
// bias pointers) are set on `desc` under `mutex` right before the enqueue.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_needed = 0;
  std::mutex mutex;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  FP8TRON_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kE4M3: return "E4M3";
    case DType::kE5M2: return "E5M2";
    case DType::kBF16: return "BF16";
    case DType::kFP32: return "FP32";
  }
  return "?";
}

DType dtype_of(Format format) {
  FP8TRON_CHECK(format == Format::kE4M3 || format == Format::kE5M2,
                std::string("no GEMM data type for format ") + format_name(format));
  return format == Format::kE4M3 ? DType::kE4M3 : DType::kE5M2;
}

struct GemmHandle::Impl {
  int device = 0;
  size_t workspace_bytes = 0;
  cublasLtHandle_t lt = nullptr;
  mutable std::mutex mutex;  // guards plans and workspaces
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
  std::unordered_map<CUstream_st*, void*> workspaces;

  void* workspace(CUstream_st* stream) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = workspaces.find(stream);
    if (it != workspaces.end()) return it->second;
    void* p = nullptr;
    FP8TRON_CUDA_CHECK(cudaMalloc(&p, workspace_bytes));
    workspaces.emplace(stream, p);
    return p;
  }

  Plan& plan(const PlanKey& key);
};

GemmHandle::GemmHandle(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  FP8TRON_CUDA_CHECK(cudaGetDevice(&impl_->device));
  impl_->workspace_bytes = workspace_bytes;
  FP8TRON_CUBLAS_CHECK(cublasLtCreate(&impl_->lt));
}

GemmHandle::~GemmHandle() {
  if (!impl_) return;
  int current = 0;
  const bool switch_device = cudaGetDevice(&current) == cudaSuccess && current != impl_->device;
  if (switch_device) cudaSetDevice(impl_->device);
  impl_->plans.clear();
  for (auto& [stream, p] : impl_->workspaces) cudaFree(p);  // cudaFree waits for pending work
  if (impl_->lt) cublasLtDestroy(impl_->lt);
  if (switch_device) cudaSetDevice(current);
}

int GemmHandle::device() const { return impl_->device; }

size_t GemmHandle::cached_plans() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->plans.size();
}

void GemmHandle::reserve_workspace(CUstream_st* stream) { impl_->workspace(stream); }

Plan& GemmHandle::Impl::plan(const PlanKey& key) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = plans.find(key);
    if (it != plans.end()) return *it->second;
  }
  auto p = std::make_unique<Plan>();
  FP8TRON_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  if (key.sm_count > 0) set_desc(p->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, key.sm_count);
  if (is_fp8(key.a_type)) {
    const int8_t fast = key.fast_accum ? 1 : 0;
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast);
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, scale_mode(key.a_scaling));
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, scale_mode(key.b_scaling));
  }
  if (key.has_bias) {
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cuda_type(key.bias_type));
  }
  // Stored shapes: op(A) is m x k, so A is k x m when transposed; op(B) is k x n.
  FP8TRON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, cuda_type(key.a_type), key.trans_a ? key.k : key.m,
                                                  key.trans_a ? key.m : key.k, key.lda));
  FP8TRON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, cuda_type(key.b_type), key.trans_b ? key.n : key.k,
                                                  key.trans_b ? key.k : key.n, key.ldb));
  FP8TRON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, cuda_type(key.d_type), key.m, key.n, key.ldd));
  FP8TRON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, cuda_type(key.d_type), key.m, key.n, key.ldd));

  cublasLtMatmulPreference_t pref = nullptr;
  FP8TRON_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                               sizeof(ws));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
  for (const auto& [attr, value] : aligns) {
    if (status == CUBLAS_STATUS_SUCCESS) status = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
  }
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->a, p->b, p->c, p->d, pref, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    throw_internal_error(__FILE__, __LINE__, __func__,
                         "cuBLASLt has no algorithm for " + key.describe() + " (" +
                             (status == CUBLAS_STATUS_SUCCESS ? std::string("no heuristic result")
                                                              : std::string(cublasLtGetStatusName(status))) +
                             ")");
  }
  p->algo = result.algo;
  p->workspace_needed = result.workspaceSize;

  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = plans.emplace(key, std::move(p));  // a racing thread may have won: keep its plan
  return *it->second;
}

void gemm(GemmHandle& handle, const GemmOperand& a, const GemmOperand& b, const GemmOutput& d,
          const GemmConfig& config, CUstream_st* stream) {
  GemmHandle::Impl& h = *handle.impl_;
  int device = 0;
  FP8TRON_CUDA_CHECK(cudaGetDevice(&device));
  FP8TRON_CHECK(device == h.device, strprintf("GemmHandle of device %d used on device %d", h.device, device));

  PlanKey key;
  key.trans_a = a.transposed;
  key.trans_b = b.transposed;
  key.m = a.transposed ? a.cols : a.rows;
  key.k = a.transposed ? a.rows : a.cols;
  key.n = b.transposed ? b.rows : b.cols;
  const int64_t kb = b.transposed ? b.cols : b.rows;
  FP8TRON_CHECK(kb == key.k, strprintf("GEMM inner dimensions differ: op(A) has k=%lld, op(B) has k=%lld",
                                      static_cast<long long>(key.k), static_cast<long long>(kb)));
  FP8TRON_CHECK(key.m > 0 && key.n > 0 && key.k > 0, "GEMM with an empty dimension");
  FP8TRON_CHECK(a.ld >= a.rows && b.ld >= b.rows && d.ld >= key.m, "leading dimension smaller than the stored rows");
  key.lda = a.ld;
  key.ldb = b.ld;
  key.ldd = d.ld;
  key.a_type = a.dtype;
  key.b_type = b.dtype;
  key.d_type = d.dtype;
  key.a_scaling = a.scaling;
  key.b_scaling = b.scaling;
  key.has_bias = config.bias != nullptr;
  key.bias_type = key.has_bias ? config.bias_dtype : DType::kBF16;
  key.accumulate = config.accumulate;
  key.sm_count = config.sm_count;
  key.align_a = alignment_of(a.data);
  key.align_b = alignment_of(b.data);
  key.align_d = alignment_of(d.data);

  FP8TRON_CHECK(d.dtype == DType::kBF16 || d.dtype == DType::kFP32, "GEMM output must be BF16 or FP32");
  FP8TRON_CHECK(is_fp8(a.dtype) == is_fp8(b.dtype), "GEMM operands must be both FP8 or both high precision");
  if (is_fp8(a.dtype)) {
    FP8TRON_CHECK(!(a.dtype == DType::kE5M2 && b.dtype == DType::kE5M2), "E5M2 x E5M2 GEMMs are not supported");
    FP8TRON_CHECK(a.transposed && !b.transposed,
                  "FP8 GEMMs on Hopper need the TN layout (A transposed, B not: both K-contiguous); "
                  "pass the quantizer's transposed copy instead: " + key.describe());
    FP8TRON_CHECK(a.ld % 16 == 0 && b.ld % 16 == 0, "FP8 GEMM leading dimensions must be multiples of 16: " +
                                                         key.describe());
    FP8TRON_CHECK(a.scale_inv != nullptr && b.scale_inv != nullptr, "FP8 GEMM operands need scale_inv");
    FP8TRON_CHECK(a.scaling != ScalingMode::kMxfp8 && b.scaling != ScalingMode::kMxfp8,
                  "MXFP8 GEMMs need Blackwell tensor cores; the MXFP8 recipe runs emulated on Hopper");
    const bool a_block = a.scaling != ScalingMode::kTensor, b_block = b.scaling != ScalingMode::kTensor;
    FP8TRON_CHECK(a_block == b_block, "FP8 GEMM operands must both be tensor-scaled or both block-scaled");
    FP8TRON_CHECK(!(a.scaling == ScalingMode::kBlock128x128 && b.scaling == ScalingMode::kBlock128x128),
                  "cuBLASLt has no 128x128 x 128x128 block-scaled GEMM (use 1x128 for one operand)");
    key.fast_accum = config.fast_accumulation && !a_block;
  } else {
    FP8TRON_CHECK(a.dtype == DType::kBF16 && b.dtype == DType::kBF16, "high-precision GEMMs take BF16 operands");
  }

  Plan& plan = h.plan(key);
  void* workspace = h.workspace(stream);
  const float alpha = config.alpha, beta = config.accumulate ? 1.0f : 0.0f;
  std::lock_guard<std::mutex> lock(plan.mutex);
  if (is_fp8(a.dtype)) {
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.scale_inv);
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b.scale_inv);
  }
  if (key.has_bias) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, config.bias);
  FP8TRON_CUBLAS_CHECK(cublasLtMatmul(h.lt, plan.desc, &alpha, a.data, plan.a, b.data, plan.b, &beta, d.data, plan.c,
                                      d.data, plan.d, &plan.algo, workspace, h.workspace_bytes, stream));
}

RowMajorMatrix rowwise_matrix(const Fp8TensorView& t) {
  FP8TRON_CHECK(t.data != nullptr, "quantized tensor has no row-wise copy");
  return {t.data, dtype_of(t.format), static_cast<int64_t>(t.rows), static_cast<int64_t>(t.cols),
          static_cast<int64_t>(t.cols), t.scale_inv, t.scaling_mode};
}

RowMajorMatrix transposed_matrix(const Fp8TensorView& t) {
  FP8TRON_CHECK(t.data_t != nullptr, "quantized tensor has no transposed copy");
  return {t.data_t, dtype_of(t.format), static_cast<int64_t>(t.cols), static_cast<int64_t>(t.rows),
          static_cast<int64_t>(t.rows), t.scale_inv_for_t(), t.scaling_mode};
}

void gemm_nt(GemmHandle& handle, const RowMajorMatrix& x, const RowMajorMatrix& w, void* y, DType y_dtype, int64_t ldy,
             const GemmConfig& config, CUstream_st* stream) {
  FP8TRON_CHECK(x.cols == w.cols, strprintf("gemm_nt: X is [%lld, %lld] but W is [%lld, %lld]",
                                            static_cast<long long>(x.rows), static_cast<long long>(x.cols),
                                            static_cast<long long>(w.rows), static_cast<long long>(w.cols)));
  // Row-major W [N, K] is column-major K x N: A = W, op = transpose -> N x K.
  GemmOperand a{w.data, w.dtype, w.cols, w.rows, w.ld, true, w.scale_inv, w.scaling};
  // Row-major X [M, K] is column-major K x M: B = X, no transpose.
  GemmOperand b{x.data, x.dtype, x.cols, x.rows, x.ld, false, x.scale_inv, x.scaling};
  // D column-major N x M with ld = ldy is row-major Y [M, N].
  gemm(handle, a, b, GemmOutput{y, y_dtype, ldy}, config, stream);
}

}  // namespace fp8tron::fp8
