// FP8 (and bf16) GEMMs through cuBLASLt, with cached descriptors and algorithms.
//
// Layout contract (read this before calling)
// ------------------------------------------
// gemm() speaks cuBLAS's column-major language: D (m x n, column-major, leading dimension ldd) =
// alpha * op(A) * op(B) [+ D] [+ bias], op(A) m x k, op(B) k x n. A GemmOperand describes the matrix
// as stored (rows x cols column-major, ld >= rows) plus whether op() transposes it.
//
// Hopper FP8 tensor cores only take "TN": A transposed and B not, i.e. both operands stored with
// the reduction dimension k contiguous ("K-major"). gemm() refuses other FP8 layouts; produce the
// other layout with the transposed copy of the quantizers (Fp8TensorView::data_t) instead.
//
// In row-major terms (torch tensors, fp8_tensor.h) a row-major [r, c] matrix is a column-major
// c x r one, and the TN FP8 GEMM is exactly   Y[M, N] = X[M, K] * W[N, K]^T   with X and W both
// row-major (K contiguous). gemm_nt() takes that form directly; a linear layer's three GEMMs are:
//   fprop  Y [M,N]  = X  [M,K] * W  [N,K]^T   x = X rowwise,   w = W rowwise
//   dgrad  dX[M,K]  = dY [M,N] * Wt [K,N]^T   x = dY rowwise,  w = W's transposed copy
//   wgrad  dW[N,K]  = dYt[N,M] * Xt [K,M]^T   x = dY's transposed copy, w = X's transposed copy
// (TE's cublaslt_gemm.cu makes the same choice of copies.)
//
// Scaling: tensor scaling passes one device float per operand (scale_inv, the dequantization
// factor); blockwise passes the fp32 block scales of fp8_tensor.h (cuBLASLt VEC128_32F for 1x128,
// BLK128x128_32F for 128x128; 128x128 x 128x128 is not supported by cuBLASLt). Block-scaled GEMMs
// need m and n divisible by 4 and 16-byte aligned scale pointers (cuBLAS docs, "128-element 1D and
// 128x128 2D block scaling"). MXFP8 has no Hopper GEMM: gemm() refuses it (the MXFP8 recipe runs
// emulated). The scale pointers of the first call are set before the heuristic query, as TE and
// torch._scaled_mm do (with them unset, the first H200 run got CUBLAS_STATUS_INVALID_VALUE for
// every block-scaled problem), and replaced on every call.
//
// Accumulation: the compute type is fp32, but Hopper's FP8 tensor cores accumulate each MMA
// (k = 32) in a 22-bit format (8-bit exponent, 13-bit mantissa, truncation; DeepSeek-V3 report
// "around 14 bits", SageAttention2 and PyTorch measure e8m13). Without fast_accumulation cuBLASLt
// promotes the partial sums to fp32 every 128 products ("split accumulator"); with it
// (CUBLASLT_MATMUL_DESC_FAST_ACCUM) it never does, which is faster and less accurate. Measured on
// H200 / CUDA 13.0 and replayed bit for bit in tests/fp8/test_gpu_gemm.cpp, which also derives the
// error bounds. TE uses fast accumulation in fprop only; it is ignored (forced off) for block
// scaling, whose per-128-k scales are applied at each promotion.
// Output: bf16 or fp32. Optional bias epilogue (length m in column-major terms = N in gemm_nt).
//
// GeLU epilogues (bf16 GEMMs; GemmConfig::activation): cuBLASLt's GELU_AUX[_BIAS] and
// DGELU[_BGRAD]. The models use neither any more (models/mlp/fused_gelu_mlp.h measures why); their GPU
// tests keep them correct for a GEMM that wants them. They compute the tanh GeLU (Megatron's and
// TE's, at::gelu(x, "tanh")). The auxiliary matrix holds the GeLU's input: m x n column-major like
// D, in D's dtype (cuBLASLt's default aux type for non-FP8 outputs), leading dimension aux_ld a
// multiple of 8 and >= m (cuBLASLt's CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD rule). In the forward
// GEMM it is an output (D = gelu(op(A) op(B) + bias), aux = op(A) op(B) + bias), in the backward an
// input (D = op(A) op(B) * gelu'(aux)), whose DGELU_BGRAD variant also writes the row sums of D
// (the bias gradient: m values, summed over D's n columns) to `bias`. cuBLASLt writes that gradient
// in D's type for non-FP8 GEMMs (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER: "Bias gradient
// vector elements are the same type as the output elements (Ctype)"; the bias's type follows D's
// likewise), so with a bf16 D it is bf16: gemm() refuses any other bias type with these epilogues.
//
// Threading and streams: a GemmHandle belongs to one device. Its plan cache is thread-safe. It
// keeps one 32 MiB workspace per stream it has seen, so GEMMs on different streams may overlap.
//
// Algorithm choice: cuBLASLt's heuristic ranks kernels with a performance model and its first
// choice is not always the fastest on the device at hand. With AlgoSelection::kAutotune (the
// default) the first call of every new problem (a plan: shapes, types, layouts, scaling modes,
// epilogue, pointer alignments) asks the heuristic for up to max_candidates algorithms, times each
// on the caller's stream with the caller's operands (warm-up, median of tuning_iterations runs, two
// passes in opposite orders) and caches the fastest (the heuristic's order breaks ties within 2%,
// i.e. timing noise and launch-bound small GEMMs). That costs a few milliseconds per problem and
// synchronizes the stream once; an accumulating GEMM is timed into a scratch output so D is not
// touched. While the stream is being captured into a CUDA graph nothing is timed (the heuristic's
// first choice is cached), so run every GEMM once before capturing. kHeuristic always takes the
// heuristic's first choice, as Transformer Engine and torch._scaled_mm do: the same kernel in every
// run and on every rank (autotuned choices may differ between runs, and kernels differ in rounding).
// plan_infos() reports each plan's candidates, their timings and the choice.
//
// Bucketed plans (grouped GEMMs: one GEMM per MoE expert, token counts that change every call):
// GemmConfig::bucket names the dimension that varies (n: the rows of X in gemm_nt, i.e. fprop and
// dgrad; k: the reduction, i.e. wgrad over tokens). The plan is then keyed by gemm_bucket(that
// dimension) instead of its value (and by pointer alignments capped at 16 bytes, which every
// expert's slice of an FP8 tensor has), created once per bucket with the heuristic's first choice
// for the bucket's upper bound, never autotuned (whatever the options say: timing every bucket
// would stall the first steps), and each call runs that algorithm with layouts of
// its exact size initialised on the stack. Should cuBLASLt refuse the bucket's algorithm for an
// exact size (it checks every call), that call falls back to a plan for its exact size (the
// heuristic's first choice), counted in GemmPlanInfo::bucket_misses.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fp8/fp8_tensor.h"

struct CUstream_st;

namespace fp8tron::fp8 {

enum class DType : uint8_t { kE4M3, kE5M2, kBF16, kFP32 };
enum class GemmBucket : uint8_t { kNone, kN, kK };
// The GeLU epilogues of the header comment: none, the forward's (D = gelu(...), aux = its input)
// or the backward's (D = ... * gelu'(aux)).
enum class GemmActivation : uint8_t { kNone, kGeluAux, kDGelu };
const char* dtype_name(DType dtype);
DType dtype_of(Format format);  // E4M3 / E5M2 only
inline bool is_fp8(DType d) { return d == DType::kE4M3 || d == DType::kE5M2; }

// A matrix as stored, column-major.
struct GemmOperand {
  const void* data = nullptr;
  DType dtype = DType::kBF16;
  int64_t rows = 0;  // stored rows (the contiguous dimension)
  int64_t cols = 0;
  int64_t ld = 0;    // leading dimension, >= rows
  bool transposed = false;          // op(X) = X^T
  const void* scale_inv = nullptr;  // FP8: device fp32 dequantization factor(s)
  ScalingMode scaling = ScalingMode::kTensor;
};

struct GemmOutput {
  void* data = nullptr;
  DType dtype = DType::kBF16;  // kBF16 or kFP32
  int64_t ld = 0;              // >= m
};

struct GemmConfig {
  bool fast_accumulation = false;
  const void* bias = nullptr;  // device vector of m values (bias_dtype), added to every column of D
  DType bias_dtype = DType::kBF16;
  bool bias_gradient = false;  // `bias` is an output instead: the bias gradient, the sum of op(B) over
                               // k (n values, one per column of D; cuBLASLt's BGRADB epilogue), as a
                               // linear's wgrad GEMM can produce it from dY without another pass.
                               // With GemmActivation::kDGelu: the sum of D over its columns (m
                               // values; DGELU_BGRAD), in D's dtype.
  GemmActivation activation = GemmActivation::kNone;  // GeLU epilogue (header comment); bf16 only
  void* aux = nullptr;  // kGeluAux: written, the GeLU's input; kDGelu: read. m x n, D's dtype; not D
  int64_t aux_ld = 0;   // its leading dimension: a multiple of 8, >= m
  bool accumulate = false;  // D = result + D (beta = 1). With a bf16 D cuBLASLt's FP8 kernels round
                            // alpha * result to bf16 before adding D (two roundings, measured on
                            // H200): accumulate gradients into an fp32 D.
  float alpha = 1.0f;
  int sm_count = 0;  // cap on SMs used (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET) for overlap; 0 = all
  GemmBucket bucket = GemmBucket::kNone;  // the dimension that varies between calls (header comment)
};

// The bucket of a token count: the smallest value >= v of the form {4, 5, 6, 7} x 2^j, at least 128
// (quarter-octave steps, so a plan serves sizes at most 25% below its own; ..., 1024, 1280, 1536,
// 1792, 2048, ...). Balanced MoE counts such as 1536 or 4096 are buckets themselves.
int64_t gemm_bucket(int64_t v);

enum class AlgoSelection : uint8_t { kHeuristic, kAutotune };
const char* algo_selection_name(AlgoSelection selection);

struct GemmHandleOptions {
  size_t workspace_bytes = size_t{32} << 20;
  AlgoSelection algo_selection = AlgoSelection::kAutotune;
  int max_candidates = 16;    // heuristic results requested (all timed when autotuning)
  int tuning_iterations = 7;  // timed runs per candidate and pass, after two warm-up runs
};

// One timed candidate of a plan.
struct GemmCandidateTiming {
  int heuristic_rank = 0;  // position in cuBLASLt's heuristic list (0: its first choice)
  std::string algo;        // algorithm configuration (ids of cublasLt.h's enums)
  size_t workspace_bytes = 0;
  float waves = 0.0f;      // the heuristic's waves count (1: one full wave of CTAs)
  double median_ms = -1;   // best of the two passes' medians; < 0 when the candidate failed to run
};

// What a cached plan runs and how it was chosen.
struct GemmPlanInfo {
  std::string problem;     // shapes, types, layouts, scaling, epilogue
  std::string algo;        // the chosen algorithm
  int heuristic_rank = 0;  // its rank in the heuristic's list
  int heuristic_results = 0;
  bool autotuned = false;
  std::string note;        // why it was not autotuned, when it was not
  std::vector<GemmCandidateTiming> candidates;  // the timed candidates; empty when none was timed
  bool bucketed = false;   // serves every size of its bucket (GemmConfig::bucket)
  int64_t bucket_misses = 0;  // calls whose exact size refused the bucket's algorithm
};

class GemmHandle {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  // Binds to the current CUDA device.
  explicit GemmHandle(size_t workspace_bytes = kDefaultWorkspaceBytes);
  explicit GemmHandle(const GemmHandleOptions& options);
  ~GemmHandle();
  GemmHandle(const GemmHandle&) = delete;
  GemmHandle& operator=(const GemmHandle&) = delete;

  int device() const;
  const GemmHandleOptions& options() const;
  size_t cached_plans() const;
  // Every cached plan, in creation order.
  std::vector<GemmPlanInfo> plan_infos() const;
  // Allocates the workspace for `stream` now: a CUDA graph's capture cannot call cudaMalloc, so
  // the owner of a handle a captured step uses calls this before capturing on that stream.
  void reserve_workspace(CUstream_st* stream);

  struct Impl;

 private:
  friend void gemm(GemmHandle&, const GemmOperand&, const GemmOperand&, const GemmOutput&, const GemmConfig&,
                   CUstream_st*);
  std::unique_ptr<Impl> impl_;
};

void gemm(GemmHandle& handle, const GemmOperand& a, const GemmOperand& b, const GemmOutput& d,
          const GemmConfig& config, CUstream_st* stream);

// A row-major matrix [rows, cols] with row stride ld (>= cols), as torch stores it.
struct RowMajorMatrix {
  const void* data = nullptr;
  DType dtype = DType::kBF16;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
  const void* scale_inv = nullptr;
  ScalingMode scaling = ScalingMode::kTensor;
};

// The row-wise copy ([rows, cols]) or the transposed copy ([cols, rows]) of a quantized tensor.
RowMajorMatrix rowwise_matrix(const Fp8TensorView& t);
RowMajorMatrix transposed_matrix(const Fp8TensorView& t);

// The gemm() operands of gemm_nt's product (below): A = W transposed, B = X, D = Y.
struct GemmProblem {
  GemmOperand a, b;
  GemmOutput d;
};
GemmProblem nt_problem(const RowMajorMatrix& x, const RowMajorMatrix& w, void* y, DType y_dtype, int64_t ldy);

// Y[M, N] = alpha * X[M, K] * W[N, K]^T (+ bias[N]) (+ Y), row-major; y has row stride ldy >= N.
// With GemmConfig::bucket, kN buckets M (the rows of X) and kK buckets K.
void gemm_nt(GemmHandle& handle, const RowMajorMatrix& x, const RowMajorMatrix& w, void* y, DType y_dtype, int64_t ldy,
             const GemmConfig& config, CUstream_st* stream);

}  // namespace fp8tron::fp8
