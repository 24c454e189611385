#include "fp8/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/text.h"
#include "core/cuda/cuda_check.h"

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
  bool trans_a = false, trans_b = false, fast_accum = false, has_bias = false, bias_grad = false, accumulate = false;
  int sm_count = 0;
  uint32_t align_a = 0, align_b = 0, align_d = 0;
  GemmBucket bucket = GemmBucket::kNone;  // kN / kK: n / k (and the lds along it) are the bucket's
  GemmActivation activation = GemmActivation::kNone;
  int64_t aux_ld = 0;     // with an activation
  uint32_t align_aux = 0;  // likewise: the heuristic picks kernels by the aux pointer's alignment too

  bool operator==(const PlanKey& o) const {
    return m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb && ldd == o.ldd && a_type == o.a_type &&
           b_type == o.b_type && d_type == o.d_type && bias_type == o.bias_type && a_scaling == o.a_scaling &&
           b_scaling == o.b_scaling && trans_a == o.trans_a && trans_b == o.trans_b && fast_accum == o.fast_accum &&
           has_bias == o.has_bias && bias_grad == o.bias_grad && accumulate == o.accumulate && sm_count == o.sm_count && align_a == o.align_a &&
           align_b == o.align_b && align_d == o.align_d && bucket == o.bucket && activation == o.activation &&
           aux_ld == o.aux_ld && align_aux == o.align_aux;
  }

  // The stored shapes (rows, cols, ld) of A, B and C/D: op(A) is m x k, so A is k x m when
  // transposed; op(B) is k x n.
  struct Layout {
    int64_t rows, cols, ld;
  };
  Layout layout_a() const { return {trans_a ? k : m, trans_a ? m : k, lda}; }
  Layout layout_b() const { return {trans_b ? n : k, trans_b ? k : n, ldb}; }
  Layout layout_d() const { return {m, n, ldd}; }

  std::string describe() const {
    const char* bucketed = bucket == GemmBucket::kN ? ", bucketed n" : bucket == GemmBucket::kK ? ", bucketed k" : "";
    const std::string gelu = activation == GemmActivation::kNone ? std::string()
                             : strprintf(", %s (aux ld %lld)", activation == GemmActivation::kGeluAux ? "GeLU" : "dGeLU",
                                         static_cast<long long>(aux_ld));
    return strprintf("m=%lld n=%lld k=%lld, A %s%s (%s, ld %lld), B %s%s (%s, ld %lld), D %s (ld %lld)%s%s%s%s%s",
                     static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                     dtype_name(a_type), trans_a ? "^T" : "", scaling_mode_name(a_scaling), static_cast<long long>(lda),
                     dtype_name(b_type), trans_b ? "^T" : "", scaling_mode_name(b_scaling), static_cast<long long>(ldb),
                     dtype_name(d_type), static_cast<long long>(ldd), fast_accum ? ", fast accumulation" : "",
                     has_bias ? (bias_grad ? ", bias gradient" : ", bias") : "", gelu.c_str(), accumulate ? ", accumulate" : "",
                     bucketed);
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
        (k.accumulate ? 16u : 0u) | (k.bias_grad ? 32u : 0u) | (static_cast<uint64_t>(k.bucket) << 8) |
        (static_cast<uint64_t>(k.activation) << 16));
    mix(static_cast<uint64_t>(k.aux_ld));
    mix(static_cast<uint64_t>(k.sm_count));
    mix((static_cast<uint64_t>(k.align_a) << 0) | (static_cast<uint64_t>(k.align_b) << 16) |
        (static_cast<uint64_t>(k.align_d) << 32) | (static_cast<uint64_t>(k.align_aux) << 48));
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
  size_t serial = 0;  // creation order
  GemmPlanInfo info;
  std::atomic<int64_t> bucket_misses{0};
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

// The pointers and scalars of one call: set on the descriptor (pointers) and passed to
// cublasLtMatmul; autotuning runs the candidates with them.
struct CallArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  const void* bias = nullptr;
  void* aux = nullptr;
  float alpha = 1.0f, beta = 0.0f;
};

void set_call_pointers(cublasLtMatmulDesc_t desc, const PlanKey& key, const CallArgs& call) {
  if (is_fp8(key.a_type)) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, call.a_scale);
    set_desc(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, call.b_scale);
  }
  if (key.has_bias) set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, call.bias);
  if (key.activation != GemmActivation::kNone) set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, call.aux);
}

// The cuBLASLt epilogue of a key: bias / bias gradient (BGRADB), or a GeLU epilogue with or
// without its bias (gradient).
uint32_t epilogue_of(const PlanKey& key) {
  switch (key.activation) {
    case GemmActivation::kGeluAux: return key.has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmActivation::kDGelu: return key.has_bias ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    case GemmActivation::kNone: break;
  }
  if (!key.has_bias) return CUBLASLT_EPILOGUE_DEFAULT;
  return key.bias_grad ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BIAS;
}

template <class T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) != CUBLAS_STATUS_SUCCESS) {
    return T{};
  }
  return value;
}

// The configuration that identifies an algorithm (numbers are cublasLt.h's enum values:
// cublasLtMatmulTile_t, cublasLtMatmulStages_t, cublasLtClusterShape_t, ...).
std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
  return strprintf("id %d tile %u stages %u splitK %d reduction %u swizzle %u custom %u inner %u cluster %u",
                   algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID),
                   algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                   algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                   algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                   algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                   algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                   algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                   static_cast<unsigned>(algo_config<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID)),
                   static_cast<unsigned>(algo_config<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)));
}

// cuBLASLt explains a refused configuration only through its logger. On a failed heuristic query
// the query is repeated with the error log captured, and the messages go into the exception.
std::mutex g_logger_mutex;
std::string* g_logger_sink = nullptr;

void capture_logger(int /*level*/, const char* function, const char* message) {
  if (g_logger_sink == nullptr) return;
  if (!g_logger_sink->empty()) *g_logger_sink += "; ";
  *g_logger_sink += std::string(function ? function : "?") + ": " + (message ? message : "");
}

template <class Fn>
std::string cublaslt_error_log(const Fn& fn) {
  std::lock_guard<std::mutex> lock(g_logger_mutex);
  std::string sink;
  g_logger_sink = &sink;
  cublasLtLoggerSetCallback(capture_logger);
  cublasLtLoggerSetMask(1);  // errors
  fn();
  cublasLtLoggerSetMask(0);
  cublasLtLoggerSetCallback(nullptr);
  g_logger_sink = nullptr;
  return sink;
}

bool stream_is_capturing(CUstream_st* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();  // e.g. the legacy stream while another stream captures globally
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

size_t dtype_bytes(DType d) { return d == DType::kFP32 ? 4 : d == DType::kBF16 ? 2 : 1; }

// Turns an exact key into its bucket's: the varying dimension becomes its bucket, and so does the
// leading dimension of an operand stored with that dimension as its (contiguous) rows, the
// transposed copies of the wgrad. Alignments are capped at 16 bytes, which every expert's slice
// has, so the experts of one call share their plans.
void bucket_key(PlanKey& key, GemmBucket bucket) {
  key.bucket = bucket;
  int64_t& dim = bucket == GemmBucket::kN ? key.n : key.k;
  const int64_t exact = dim;
  dim = gemm_bucket(exact);
  auto grow = [&](int64_t& ld) { ld = ld == exact ? dim : std::max(ld, dim); };
  const bool a_rows_vary = bucket == GemmBucket::kK && key.trans_a;  // A stored k x m when transposed
  const bool b_rows_vary = bucket == GemmBucket::kK ? !key.trans_b : key.trans_b;  // B: k x n, or n x k
  if (a_rows_vary) grow(key.lda);
  if (b_rows_vary) grow(key.ldb);
  key.align_a = std::min<uint32_t>(key.align_a, 16);
  key.align_b = std::min<uint32_t>(key.align_b, 16);
  key.align_d = std::min<uint32_t>(key.align_d, 16);
}

bool same_layouts(const PlanKey& x, const PlanKey& y) {
  return x.m == y.m && x.n == y.n && x.k == y.k && x.lda == y.lda && x.ldb == y.ldb && x.ldd == y.ldd;
}

void init_layout(cublasLtMatrixLayoutOpaque_t* layout, DType type, const PlanKey::Layout& l) {
  FP8TRON_CUBLAS_CHECK(cublasLtMatrixLayoutInit(layout, cuda_type(type), static_cast<uint64_t>(l.rows),
                                                static_cast<uint64_t>(l.cols), l.ld));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? -1.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
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

int64_t gemm_bucket(int64_t v) {
  int64_t base = 32;  // buckets 4, 5, 6, 7 x base, doubling base
  while (true) {
    for (int64_t f = 4; f < 8; ++f) {
      if (f * base >= v) return f * base;
    }
    base *= 2;
  }
}

const char* algo_selection_name(AlgoSelection selection) {
  return selection == AlgoSelection::kAutotune ? "autotune" : "heuristic";
}

DType dtype_of(Format format) {
  FP8TRON_CHECK(format == Format::kE4M3 || format == Format::kE5M2,
                std::string("no GEMM data type for format ") + format_name(format));
  return format == Format::kE4M3 ? DType::kE4M3 : DType::kE5M2;
}

struct GemmHandle::Impl {
  int device = 0;
  GemmHandleOptions options;
  cublasLtHandle_t lt = nullptr;
  mutable std::mutex mutex;  // guards plans and workspaces
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
  std::unordered_map<CUstream_st*, void*> workspaces;

  void* workspace(CUstream_st* stream) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = workspaces.find(stream);
    if (it != workspaces.end()) return it->second;
    void* p = nullptr;
    FP8TRON_CUDA_CHECK(cudaMalloc(&p, options.workspace_bytes));
    workspaces.emplace(stream, p);
    return p;
  }

  // The cached plan of `key`, created on first use (heuristic_only: never autotuned).
  Plan& plan(const PlanKey& key, const CallArgs& call, CUstream_st* stream, bool heuristic_only);
  // Times the candidates on `stream`; returns the index of the fastest (or -1 and a note).
  int autotune(Plan& p, const PlanKey& key, const CallArgs& call, const std::vector<cublasLtMatmulHeuristicResult_t>& cands,
               CUstream_st* stream, std::vector<GemmCandidateTiming>& timings, std::string& note);
};

GemmHandle::GemmHandle(size_t workspace_bytes) : GemmHandle([&] {
  GemmHandleOptions o;
  o.workspace_bytes = workspace_bytes;
  return o;
}()) {}

GemmHandle::GemmHandle(const GemmHandleOptions& options) : impl_(std::make_unique<Impl>()) {
  FP8TRON_CUDA_CHECK(cudaGetDevice(&impl_->device));
  impl_->options = options;
  FP8TRON_CHECK(impl_->options.max_candidates >= 1 && impl_->options.tuning_iterations >= 1,
                "GemmHandleOptions: max_candidates and tuning_iterations must be >= 1");
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

const GemmHandleOptions& GemmHandle::options() const { return impl_->options; }

size_t GemmHandle::cached_plans() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->plans.size();
}

std::vector<GemmPlanInfo> GemmHandle::plan_infos() const {
  std::vector<std::pair<size_t, GemmPlanInfo>> ordered;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (const auto& [key, plan] : impl_->plans) {
      ordered.emplace_back(plan->serial, plan->info);
      ordered.back().second.bucket_misses = plan->bucket_misses.load();
    }
  }
  std::sort(ordered.begin(), ordered.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<GemmPlanInfo> out;
  for (auto& [serial, info] : ordered) out.push_back(std::move(info));
  return out;
}

void GemmHandle::reserve_workspace(CUstream_st* stream) { impl_->workspace(stream); }

int GemmHandle::Impl::autotune(Plan& p, const PlanKey& key, const CallArgs& call,
                               const std::vector<cublasLtMatmulHeuristicResult_t>& cands, CUstream_st* stream,
                               std::vector<GemmCandidateTiming>& timings, std::string& note) {
  void* ws = workspace(stream);
  // Released on every exit (a failed CUDA call throws).
  struct Resources {
    void* scratch = nullptr;
    std::vector<cudaEvent_t> events;
    ~Resources() {
      for (cudaEvent_t e : events) {
        if (e) cudaEventDestroy(e);
      }
      if (scratch) cudaFree(scratch);  // synchronizes with the timed runs
    }
  } res;
  // An accumulating GEMM reads D: time it into a zeroed scratch output instead.
  void* out = call.d;
  if (key.accumulate) {
    const size_t bytes = static_cast<size_t>(key.ldd) * static_cast<size_t>(key.n) * dtype_bytes(key.d_type);
    if (cudaMalloc(&res.scratch, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      res.scratch = nullptr;
      note = strprintf("no memory for a %zu-byte scratch output to time an accumulating GEMM", bytes);
      return -1;
    }
    FP8TRON_CUDA_CHECK(cudaMemsetAsync(res.scratch, 0, bytes, stream));
    out = res.scratch;
  }
  const int iters = options.tuning_iterations;
  const size_t n = cands.size();
  std::vector<cudaEvent_t>& events = res.events;
  events.assign(n * static_cast<size_t>(iters + 1), nullptr);
  for (auto& e : events) FP8TRON_CUDA_CHECK(cudaEventCreate(&e));
  std::vector<bool> ok(n, true);
  std::vector<double> best(n, -1.0);
  auto run = [&](size_t i) {
    const cublasStatus_t st = cublasLtMatmul(lt, p.desc, &call.alpha, call.a, p.a, call.b, p.b, &call.beta, out, p.c,
                                             out, p.d, &cands[i].algo, ws, options.workspace_bytes, stream);
    if (st != CUBLAS_STATUS_SUCCESS) ok[i] = false;
  };
  for (int pass = 0; pass < 2; ++pass) {  // forward, then reverse: clock drift favours no one
    for (size_t j = 0; j < n; ++j) {
      const size_t i = pass == 0 ? j : n - 1 - j;
      run(i);
      run(i);  // warm-up
      cudaEvent_t* ev = &events[i * static_cast<size_t>(iters + 1)];
      FP8TRON_CUDA_CHECK(cudaEventRecord(ev[0], stream));
      for (int t = 0; t < iters; ++t) {
        run(i);
        FP8TRON_CUDA_CHECK(cudaEventRecord(ev[t + 1], stream));
      }
    }
    FP8TRON_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < n; ++i) {
      if (!ok[i]) continue;
      const cudaEvent_t* ev = &events[i * static_cast<size_t>(iters + 1)];
      std::vector<double> ms(static_cast<size_t>(iters));
      for (int t = 0; t < iters; ++t) {
        float e = 0.0f;
        FP8TRON_CUDA_CHECK(cudaEventElapsedTime(&e, ev[t], ev[t + 1]));
        ms[static_cast<size_t>(t)] = e;
      }
      const double m = median(ms);
      best[i] = best[i] < 0 ? m : std::min(best[i], m);
    }
  }
  // The heuristic's order breaks near-ties: a candidate within 2% of the fastest time (timing noise,
  // or launch-bound small GEMMs where every kernel looks alike) loses to a better-ranked one.
  double fastest_ms = -1.0;
  for (size_t i = 0; i < n; ++i) {
    timings[i].median_ms = ok[i] ? best[i] : -1.0;
    if (ok[i] && (fastest_ms < 0 || best[i] < fastest_ms)) fastest_ms = best[i];
  }
  if (fastest_ms < 0) {
    note = "no candidate ran";
    return -1;
  }
  for (size_t i = 0; i < n; ++i) {
    if (ok[i] && best[i] <= 1.02 * fastest_ms) return static_cast<int>(i);
  }
  return -1;
}

Plan& GemmHandle::Impl::plan(const PlanKey& key, const CallArgs& call, CUstream_st* stream, bool heuristic_only) {
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
    const int32_t a_mode = scale_mode(key.a_scaling), b_mode = scale_mode(key.b_scaling);
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode);
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode);
  }
  const uint32_t epilogue = epilogue_of(key);
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (key.activation != GemmActivation::kNone) {
    // The bias (gradient) and aux types are left at their defaults, D's type: the only choice for
    // non-FP8 GEMMs (gemm() checks the bias's), as Transformer Engine leaves them.
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, key.aux_ld);
  } else if (key.has_bias) {
    const int32_t bias_type = cuda_type(key.bias_type);
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
  }
  // The heuristic sees the real pointers, as in TE and torch._scaled_mm. Without them every
  // block-scaled query failed (CUBLAS_STATUS_INVALID_VALUE) on the first H200 run.
  set_call_pointers(p->desc, key, call);
  const PlanKey::Layout la = key.layout_a(), lb = key.layout_b(), ld = key.layout_d();
  FP8TRON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, cuda_type(key.a_type), la.rows, la.cols, la.ld));
  FP8TRON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, cuda_type(key.b_type), lb.rows, lb.cols, lb.ld));
  FP8TRON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, cuda_type(key.d_type), ld.rows, ld.cols, ld.ld));
  FP8TRON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, cuda_type(key.d_type), ld.rows, ld.cols, ld.ld));

  cublasLtMatmulPreference_t pref = nullptr;
  FP8TRON_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = options.workspace_bytes;
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(options.max_candidates));
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
  auto query = [&] {
    return cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->a, p->b, p->c, p->d, pref, options.max_candidates,
                                          results.data(), &found);
  };
  if (status == CUBLAS_STATUS_SUCCESS) status = query();
  std::vector<cublasLtMatmulHeuristicResult_t> cands;
  for (int i = 0; status == CUBLAS_STATUS_SUCCESS && i < found; ++i) {
    if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS) cands.push_back(results[static_cast<size_t>(i)]);
  }
  if (cands.empty()) {
    const std::string log = status == CUBLAS_STATUS_SUCCESS ? std::string() : cublaslt_error_log([&] { query(); });
    cublasLtMatmulPreferenceDestroy(pref);
    throw_internal_error(__FILE__, __LINE__, __func__,
                         "cuBLASLt has no algorithm for " + key.describe() + " (" +
                             (status == CUBLAS_STATUS_SUCCESS ? std::string("no heuristic result")
                                                              : std::string(cublasLtGetStatusName(status))) +
                             strprintf("; cuBLASLt %zu", cublasLtGetVersion()) +
                             (log.empty() ? std::string() : "; cuBLASLt log: " + log) + ")");
  }
  cublasLtMatmulPreferenceDestroy(pref);

  GemmPlanInfo& info = p->info;
  info.problem = key.describe();
  info.heuristic_results = static_cast<int>(cands.size());
  info.bucketed = key.bucket != GemmBucket::kNone;
  int chosen = 0;
  if (info.bucketed) {
    info.note = "heuristic's first choice for the bucket's largest size (bucketed plan)";
  } else if (heuristic_only) {
    info.note = "heuristic's first choice (exact-size fallback of a bucketed plan)";
  } else if (options.algo_selection != AlgoSelection::kAutotune) {
    info.note = "heuristic's first choice (algo selection: heuristic)";
  } else if (cands.size() == 1) {
    info.note = "the heuristic offered one algorithm";
  } else if (stream_is_capturing(stream)) {
    info.note = "heuristic's first choice: created during CUDA graph capture, where nothing can be timed";
  } else {
    std::vector<GemmCandidateTiming> timings(cands.size());
    for (size_t i = 0; i < cands.size(); ++i) {
      timings[i].heuristic_rank = static_cast<int>(i);
      timings[i].algo = describe_algo(cands[i].algo);
      timings[i].workspace_bytes = cands[i].workspaceSize;
      timings[i].waves = cands[i].wavesCount;
    }
    std::string note;
    const int fastest = autotune(*p, key, call, cands, stream, timings, note);
    if (fastest >= 0) {
      chosen = fastest;
      info.autotuned = true;
    } else {
      info.note = "heuristic's first choice: " + note;
    }
    info.candidates = std::move(timings);
  }
  p->algo = cands[static_cast<size_t>(chosen)].algo;
  p->workspace_needed = cands[static_cast<size_t>(chosen)].workspaceSize;
  info.heuristic_rank = chosen;
  info.algo = describe_algo(p->algo);

  std::lock_guard<std::mutex> lock(mutex);
  p->serial = plans.size();
  auto [it, inserted] = plans.emplace(key, std::move(p));  // a racing thread may have won: keep its plan
  return *it->second;
}

namespace {
// The GeLU epilogues' rules (gemm.h): bf16 GEMMs, an aux matrix cuBLASLt accepts, a bias (gradient)
// in D's type, the bias gradient only with the backward's and never a bias added to it.
void check_gelu_epilogue(const PlanKey& key, const GemmOperand& a, const GemmOutput& d, const GemmConfig& config) {
  auto what = [&key] { return " (GeLU epilogue: " + key.describe() + ")"; };  // built only on failure
  FP8TRON_CHECK(!is_fp8(a.dtype), "the GeLU epilogues are for bf16 GEMMs" + what());
  FP8TRON_CHECK(config.aux != nullptr, "a GeLU epilogue needs its aux matrix" + what());
  FP8TRON_CHECK(config.aux_ld >= key.m && config.aux_ld % 8 == 0,
                "the GeLU epilogue's aux leading dimension must be a multiple of 8 and at least m" + what());
  FP8TRON_CHECK(!config.accumulate && config.bucket == GemmBucket::kNone,
                "a GeLU epilogue neither accumulates nor takes bucketed plans" + what());
  FP8TRON_CHECK(config.bias == nullptr || config.bias_dtype == d.dtype,
                "cuBLASLt's GeLU epilogues take the bias (gradient) in D's dtype" + what());
  if (config.activation == GemmActivation::kGeluAux) {
    FP8TRON_CHECK(!config.bias_gradient, "the forward GeLU epilogue adds a bias; it computes no bias gradient" + what());
  } else {
    FP8TRON_CHECK(config.bias == nullptr || config.bias_gradient,
                  "the backward GeLU epilogue adds no bias; it can write the bias gradient" + what());
    FP8TRON_CHECK(config.aux != d.data, "the backward GeLU epilogue reads aux while it writes D: they must differ" + what());
  }
}
}  // namespace

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
  key.bias_grad = key.has_bias && config.bias_gradient;
  key.accumulate = config.accumulate;
  key.sm_count = config.sm_count;
  key.align_a = alignment_of(a.data);
  key.align_b = alignment_of(b.data);
  key.align_d = alignment_of(d.data);
  key.activation = config.activation;
  if (key.activation != GemmActivation::kNone) {
    key.aux_ld = config.aux_ld;
    key.align_aux = alignment_of(config.aux);
    check_gelu_epilogue(key, a, d, config);
  }

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
    if (a_block) {
      FP8TRON_CHECK(key.m % 4 == 0 && key.n % 4 == 0,
                    "block-scaled GEMMs need m and n divisible by 4 (cuBLASLt): " + key.describe());
      FP8TRON_CHECK(alignment_of(a.scale_inv) >= 16 && alignment_of(b.scale_inv) >= 16,
                    "block-scaled GEMMs need 16-byte aligned scale pointers (cuBLASLt): " + key.describe());
    }
    key.fast_accum = config.fast_accumulation && !a_block;
  } else {
    FP8TRON_CHECK(a.dtype == DType::kBF16 && b.dtype == DType::kBF16, "high-precision GEMMs take BF16 operands");
  }

  CallArgs call;
  call.a = a.data;
  call.b = b.data;
  call.d = d.data;
  call.a_scale = a.scale_inv;
  call.b_scale = b.scale_inv;
  call.bias = config.bias;
  call.aux = config.aux;
  call.alpha = config.alpha;
  call.beta = config.accumulate ? 1.0f : 0.0f;
  const PlanKey exact = key;
  const bool bucketed = config.bucket != GemmBucket::kNone;
  if (bucketed) bucket_key(key, config.bucket);
  Plan& plan = h.plan(key, call, stream, bucketed);
  void* workspace = h.workspace(stream);
  auto run = [&](Plan& p, const PlanKey& plan_key) {
    std::lock_guard<std::mutex> lock(p.mutex);
    set_call_pointers(p.desc, plan_key, call);
    if (same_layouts(plan_key, exact)) {
      return cublasLtMatmul(h.lt, p.desc, &call.alpha, call.a, p.a, call.b, p.b, &call.beta, call.d, p.c, call.d, p.d,
                            &p.algo, workspace, h.options.workspace_bytes, stream);
    }
    // A bucketed plan on a smaller size: the same descriptor and algorithm, exact layouts.
    cublasLtMatrixLayoutOpaque_t la, lb, ld;
    init_layout(&la, exact.a_type, exact.layout_a());
    init_layout(&lb, exact.b_type, exact.layout_b());
    init_layout(&ld, exact.d_type, exact.layout_d());
    return cublasLtMatmul(h.lt, p.desc, &call.alpha, call.a, &la, call.b, &lb, &call.beta, call.d, &ld, call.d, &ld,
                          &p.algo, workspace, h.options.workspace_bytes, stream);
  };
  cublasStatus_t status = run(plan, key);
  if (status != CUBLAS_STATUS_SUCCESS && bucketed) {
    // cuBLASLt checks the algorithm against the exact problem on every call: refused, this size
    // gets its own plan (the heuristic's first choice for it).
    ++plan.bucket_misses;
    status = run(h.plan(exact, call, stream, true), exact);
  }
  if (status != CUBLAS_STATUS_SUCCESS)
    throw_internal_error(__FILE__, __LINE__, __func__,
                         std::string("cublasLtMatmul failed: ") + cublasLtGetStatusName(status) + " (" +
                             cublasLtGetStatusString(status) + ") for " + exact.describe() +
                             strprintf(" (alignments: A %u, B %u, D %u, A scale %u, B scale %u bytes)",
                                       alignment_of(a.data), alignment_of(b.data), alignment_of(d.data),
                                       alignment_of(a.scale_inv), alignment_of(b.scale_inv)));
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

GemmProblem nt_problem(const RowMajorMatrix& x, const RowMajorMatrix& w, void* y, DType y_dtype, int64_t ldy) {
  FP8TRON_CHECK(x.cols == w.cols, strprintf("gemm_nt: X is [%lld, %lld] but W is [%lld, %lld]",
                                            static_cast<long long>(x.rows), static_cast<long long>(x.cols),
                                            static_cast<long long>(w.rows), static_cast<long long>(w.cols)));
  GemmProblem p;
  // Row-major W [N, K] is column-major K x N: A = W, op = transpose -> N x K.
  p.a = GemmOperand{w.data, w.dtype, w.cols, w.rows, w.ld, true, w.scale_inv, w.scaling};
  // Row-major X [M, K] is column-major K x M: B = X, no transpose.
  p.b = GemmOperand{x.data, x.dtype, x.cols, x.rows, x.ld, false, x.scale_inv, x.scaling};
  // D column-major N x M with ld = ldy is row-major Y [M, N].
  p.d = GemmOutput{y, y_dtype, ldy};
  return p;
}

void gemm_nt(GemmHandle& handle, const RowMajorMatrix& x, const RowMajorMatrix& w, void* y, DType y_dtype, int64_t ldy,
             const GemmConfig& config, CUstream_st* stream) {
  const GemmProblem p = nt_problem(x, w, y, y_dtype, ldy);
  gemm(handle, p.a, p.b, p.d, config, stream);
}

}  // namespace fp8tron::fp8
