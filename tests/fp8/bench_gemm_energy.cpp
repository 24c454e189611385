// Which cuBLASLt algorithm of a dense model's bf16 GEMMs is fastest at the GPU's power cap.
//
// A bf16 training step on an H200 runs at its 700 W limit (docs/performance.md, "The power cap"): the
// clock sinks until the power fits, so a GEMM's speed in the step follows its energy per call, not
// its speed on a cool GPU, which is what autotuning and the heuristic's model rank. This benchmark
// keeps the GPU at the cap and, for every GEMM of a linear (fprop with its bias epilogue, dgrad,
// wgrad into an fp32 main gradient, and the same wgrad with a bf16 result as a compiled PyTorch
// model writes it), times each of the heuristic's candidates in a sustained window of back-to-back
// calls, reading the board's energy counter and SM clock through NVML (loaded at run time; the
// figures are "-" without it). Two passes in opposite orders; each candidate's figures are the mean
// of both. Per GEMM it prints every candidate; per model the step's sums for the heuristic's first
// choice, the fastest candidate on a cool GPU (short burst) and the fastest at the cap.
//
// Build and run (on a machine with a GPU):
//   ./scripts/build.sh fp8tron_bench_gemm_energy
//   build/tests/fp8/fp8tron_bench_gemm_energy [model substring] [candidates] [window ms]
#include <ATen/cuda/CUDAContext.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

// ---- NVML, declared here and loaded with dlopen (the driver ships it; the toolkit's headers
// on the build machine may not).
using NvmlDevice = struct nvml_device_opaque*;
struct Nvml {
  int (*init)() = nullptr;
  int (*by_pci)(const char*, NvmlDevice*) = nullptr;
  int (*energy_mj)(NvmlDevice, unsigned long long*) = nullptr;
  int (*clock_mhz)(NvmlDevice, int, unsigned int*) = nullptr;
  int (*power_mw)(NvmlDevice, unsigned int*) = nullptr;
  NvmlDevice device = nullptr;

  bool load(int cuda_device) {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) return false;
    init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    by_pci = reinterpret_cast<int (*)(const char*, NvmlDevice*)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    energy_mj = reinterpret_cast<int (*)(NvmlDevice, unsigned long long*)>(
        dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    clock_mhz = reinterpret_cast<int (*)(NvmlDevice, int, unsigned int*)>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    power_mw = reinterpret_cast<int (*)(NvmlDevice, unsigned int*)>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    if (!init || !by_pci || !energy_mj || !clock_mhz || !power_mw || init() != 0) return false;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), cuda_device) != cudaSuccess) return false;
    return by_pci(bus, &device) == 0;
  }
  double energy_j() const {
    unsigned long long mj = 0;
    return device && energy_mj(device, &mj) == 0 ? double(mj) * 1e-3 : -1.0;
  }
  double sm_clock() const {
    unsigned int mhz = 0;
    return device && clock_mhz(device, /*NVML_CLOCK_SM*/ 1, &mhz) == 0 ? double(mhz) : -1.0;
  }
  double watts() const {
    unsigned int mw = 0;
    return device && power_mw(device, &mw) == 0 ? double(mw) * 1e-3 : -1.0;
  }
};

Nvml g_nvml;
int g_candidates = 10;
double g_window_ms = 150.0;

#define LT_CHECK(x)                                                                  \
  do {                                                                               \
    const cublasStatus_t s_ = (x);                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
      std::fprintf(stderr, "%s:%d: %s -> status %d\n", __FILE__, __LINE__, #x, (int)s_); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

cudaStream_t stream() { return at::cuda::getCurrentCUDAStream().stream(); }

// One GEMM in cuBLAS's column-major terms: D (m x n) = op(A) (m x k) op(B) (k x n) [+ bias].
struct Problem {
  std::string name;
  int64_t m, n, k;
  bool trans_a, trans_b;
  cudaDataType_t d_type;
  bool bias;
  int per_step;
  bool in_step = true;  // counted in the step's sums (the bf16 wgrad is a comparison only)
};

struct Measured {
  double burst_ms = 0, sustained_ms = 0, joules = 0, watts = 0, mhz = 0;
  int runs = 0;
};

struct Candidate {
  cublasLtMatmulAlgo_t algo;
  std::string text;
  Measured m;
  bool ok = true;
};

template <class T>
T algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
  return v;
}

std::string describe(const cublasLtMatmulAlgo_t& a) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "id %d tile %u stages %u splitK %d swizzle %u inner %u cluster %u",
                algo_attr<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID), algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
                algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                algo_attr<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                (unsigned)algo_attr<uint16_t>(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
                (unsigned)algo_attr<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
  return buf;
}

double event_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms;
}

class Runner {
 public:
  explicit Runner(const Problem& p) : p_(p) {
    const auto bf = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    torch::manual_seed(1);
    // Data like a step's: unit-scale activations and gradients, small weights (the tensor cores'
    // power depends on the bits they see).
    a_ = torch::randn({p.trans_a ? p.m : p.k, p.trans_a ? p.k : p.m}, bf);
    b_ = torch::randn({p.trans_b ? p.k : p.n, p.trans_b ? p.n : p.k}, bf);
    d_ = torch::empty({p.n, p.m}, bf.dtype(p.d_type == CUDA_R_32F ? torch::kFloat32 : torch::kBFloat16));
    bias_ = torch::randn({p.m}, bf);
    ws_ = torch::empty({int64_t{32} << 20}, bf.dtype(torch::kUInt8));
    LT_CHECK(cublasLtCreate(&lt_));
    LT_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (p.bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const void* ptr = bias_.data_ptr();
      const cudaDataType_t bias_type = CUDA_R_16BF;
      LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr, sizeof(ptr)));
      LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    // Stored shapes (column-major rows x cols, ld = rows).
    const int64_t a_rows = p.trans_a ? p.k : p.m, a_cols = p.trans_a ? p.m : p.k;
    const int64_t b_rows = p.trans_b ? p.n : p.k, b_cols = p.trans_b ? p.k : p.n;
    LT_CHECK(cublasLtMatrixLayoutCreate(&la_, CUDA_R_16BF, a_rows, a_cols, a_rows));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lb_, CUDA_R_16BF, b_rows, b_cols, b_rows));
    LT_CHECK(cublasLtMatrixLayoutCreate(&ld_, p.d_type, p.m, p.n, p.m));
  }
  ~Runner() {
    cublasLtMatrixLayoutDestroy(la_);
    cublasLtMatrixLayoutDestroy(lb_);
    cublasLtMatrixLayoutDestroy(ld_);
    cublasLtMatmulDescDestroy(desc_);
    cublasLtDestroy(lt_);
  }

  std::vector<Candidate> candidates() {
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = ws_.numel();
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    std::vector<cublasLtMatmulHeuristicResult_t> r(static_cast<size_t>(g_candidates));
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, desc_, la_, lb_, ld_, ld_, pref, g_candidates, r.data(), &found));
    cublasLtMatmulPreferenceDestroy(pref);
    std::vector<Candidate> out;
    for (int i = 0; i < found; ++i) out.push_back({r[static_cast<size_t>(i)].algo, describe(r[static_cast<size_t>(i)].algo), {}, true});
    return out;
  }

  bool run(const cublasLtMatmulAlgo_t& algo) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(lt_, desc_, &alpha, a_.data_ptr(), la_, b_.data_ptr(), lb_, &beta, d_.data_ptr(), ld_,
                          d_.data_ptr(), ld_, &algo, ws_.data_ptr(), ws_.numel(), stream()) == CUBLAS_STATUS_SUCCESS;
  }

  // A short burst (the cool-GPU time an autotuner sees), then a warm-up window and a timed window
  // of back-to-back calls with the energy counter read around it and the clock sampled halfway.
  bool measure(Candidate& c) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 3; ++i)
      if (!run(c.algo)) return false;
    cudaEventRecord(e0, stream());
    for (int i = 0; i < 5; ++i) run(c.algo);
    cudaEventRecord(e1, stream());
    cudaEventSynchronize(e1);
    const double burst = event_ms(e0, e1) / 5;
    const int calls = std::max(5, int(g_window_ms / burst));
    for (int i = 0; i < calls / 2; ++i) run(c.algo);  // warm-up: half a window
    cudaEventRecord(e0, stream());
    cudaEventSynchronize(e0);
    const double j0 = g_nvml.energy_j();
    for (int i = 0; i < calls; ++i) run(c.algo);
    cudaEventRecord(e1, stream());
    std::this_thread::sleep_for(std::chrono::microseconds(int64_t(g_window_ms * 500)));
    const double mhz = g_nvml.sm_clock(), watts = g_nvml.watts();
    cudaEventSynchronize(e1);
    const double j1 = g_nvml.energy_j();
    const double sustained = event_ms(e0, e1) / calls;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    Measured& m = c.m;
    m.burst_ms += burst;
    m.sustained_ms += sustained;
    m.joules += j0 >= 0 && j1 >= 0 ? (j1 - j0) / calls : 0.0;
    m.watts += watts;
    m.mhz += mhz;
    ++m.runs;
    return true;
  }

 private:
  Problem p_;
  torch::Tensor a_, b_, d_, bias_, ws_;
  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, ld_ = nullptr;
};

struct Linear {
  const char* name;
  int64_t in, out;
  bool bias;  // in the fprop's epilogue: qkv and fc1; proj and fc2 leave theirs to the next norm
  int per_step;
};

struct Model {
  const char* name;
  int64_t tokens;
  std::vector<Linear> linears;
};

// The three GEMMs of a linear (gemm.h's layouts: fprop TN, dgrad NN, wgrad NT) and the bf16 wgrad.
std::vector<Problem> problems_of(const Model& model) {
  std::vector<Problem> out;
  const int64_t t = model.tokens;
  for (const Linear& l : model.linears) {
    const std::string n = l.name;
    out.push_back({n + " fprop", l.out, t, l.in, true, false, CUDA_R_16BF, l.bias, l.per_step});
    out.push_back({n + " dgrad", l.in, t, l.out, false, false, CUDA_R_16BF, false, l.per_step});
    out.push_back({n + " wgrad fp32", l.in, l.out, t, false, true, CUDA_R_32F, false, l.per_step});
    out.push_back({n + " wgrad bf16", l.in, l.out, t, false, true, CUDA_R_16BF, false, l.per_step, false});
  }
  return out;
}

struct StepSums {
  double first = 0, burst_best = 0, cap_best = 0, first_j = 0, cap_best_j = 0;
};

void bench(const Model& model) {
  std::printf("\n== %s, %lld tokens per micro-batch; per candidate: burst ms (cool GPU), ms at the cap, W, MHz, mJ/call\n",
              model.name, (long long)model.tokens);
  StepSums sums;
  for (const Problem& p : problems_of(model)) {
    Runner runner(p);
    std::vector<Candidate> cands = runner.candidates();
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t j = 0; j < cands.size(); ++j) {
        Candidate& c = cands[pass == 0 ? j : cands.size() - 1 - j];
        if (c.ok) c.ok = runner.measure(c);
      }
    }
    const double flops = 2.0 * double(p.m) * double(p.n) * double(p.k);
    std::printf("-- %s: m %lld n %lld k %lld%s (x%d per step)\n", p.name.c_str(), (long long)p.m, (long long)p.n,
                (long long)p.k, p.bias ? " +bias" : "", p.per_step);
    int burst_best = -1, cap_best = -1;
    for (size_t i = 0; i < cands.size(); ++i) {
      Candidate& c = cands[i];
      if (!c.ok || c.m.runs == 0) {
        std::printf("   rank %2zu failed  %s\n", i, c.text.c_str());
        continue;
      }
      const double r = c.m.runs;
      c.m = {c.m.burst_ms / r, c.m.sustained_ms / r, c.m.joules / r, c.m.watts / r, c.m.mhz / r, c.m.runs};
      std::printf("   rank %2zu %8.3f %8.3f ms %5.0f TFLOP/s %4.0f W %5.0f MHz %8.2f mJ  %s\n", i, c.m.burst_ms,
                  c.m.sustained_ms, flops / (c.m.sustained_ms * 1e9), c.m.watts, c.m.mhz, c.m.joules * 1e3,
                  c.text.c_str());
      if (burst_best < 0 || c.m.burst_ms < cands[size_t(burst_best)].m.burst_ms) burst_best = int(i);
      if (cap_best < 0 || c.m.sustained_ms < cands[size_t(cap_best)].m.sustained_ms) cap_best = int(i);
    }
    if (cap_best < 0 || !cands[0].ok) continue;
    const Measured &first = cands[0].m, &burst = cands[size_t(burst_best)].m, &cap = cands[size_t(cap_best)].m;
    std::printf("   at the cap: first choice %.3f ms, cool-GPU pick (rank %d) %.3f, cap pick (rank %d) %.3f (%+.1f%%)\n",
                first.sustained_ms, burst_best, burst.sustained_ms, cap_best, cap.sustained_ms,
                100.0 * (cap.sustained_ms / first.sustained_ms - 1.0));
    if (!p.in_step) continue;
    sums.first += first.sustained_ms * p.per_step;
    sums.burst_best += burst.sustained_ms * p.per_step;
    sums.cap_best += cap.sustained_ms * p.per_step;
    sums.first_j += first.joules * p.per_step;
    sums.cap_best_j += cap.joules * p.per_step;
  }
  std::printf("-- %s, one step's GEMMs at the cap (fprop + dgrad + fp32 wgrad): heuristic's first %.2f ms (%.1f J), "
              "cool-GPU picks %.2f ms, cap picks %.2f ms (%.1f J, %+.1f%%)\n",
              model.name, sums.first, sums.first_j, sums.burst_best, sums.cap_best, sums.cap_best_j,
              100.0 * (sums.cap_best / sums.first - 1.0));
}

}  // namespace

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::printf("no GPU\n");
    return 0;
  }
  const std::string filter = argc > 1 ? argv[1] : "";
  if (argc > 2) g_candidates = std::atoi(argv[2]);
  if (argc > 3) g_window_ms = std::atof(argv[3]);
  int device = 0;
  cudaGetDevice(&device);
  std::printf("NVML %s\n", g_nvml.load(device) ? "loaded" : "not available: no energy or clock figures");
  const std::vector<Model> models = {
      {"GPT-2 124M", 16 * 1024,
       {{"qkv", 768, 2304, true, 12}, {"proj", 768, 768, false, 12}, {"fc1", 768, 3072, true, 12},
        {"fc2", 3072, 768, false, 12}, {"logits", 768, 50304, false, 1}}},
      {"GPT 1.3B", 4 * 2048,
       {{"qkv", 2048, 6144, true, 24}, {"proj", 2048, 2048, false, 24}, {"fc1", 2048, 8192, true, 24},
        {"fc2", 8192, 2048, false, 24}, {"logits", 2048, 50304, false, 1}}},
      {"LLaMA-style 1.1B", 4 * 2048,
       {{"qkv", 2048, 3072, false, 16}, {"proj", 2048, 2048, false, 16}, {"fc1", 2048, 11264, false, 16},
        {"fc2", 5632, 2048, false, 16}, {"logits", 2048, 32000, false, 1}}},
  };
  for (const Model& m : models)
    if (filter.empty() || std::string(m.name).find(filter) != std::string::npos) bench(m);
  return 0;
}
