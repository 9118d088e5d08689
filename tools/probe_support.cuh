// What the standalone GPU probes (gemm_algorithms, gemm_beside_held_sms, gemm_beside_traffic,
// nccl_symmetric_beside_gemm, adamw_bandwidth, pdl_chain) share: checks that print and exit, random
// fills, bf16 operands for the GEMM probes, and (ProbeGemm) a shape's cuBLASLt products timed in a
// loop, for the probes that time GEMMs beside other work. Kept apart from src/ so the probes build
// with nvcc alone.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

// Each check prints where and what failed, with the library's own words, and exits.
#define PROBE_CHECK(x, ok, words)                                              \
  do {                                                                         \
    const auto s_ = (x);                                                       \
    if (!(ok)) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, (words)); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)
#define CHECK_CUDA(x) PROBE_CHECK(x, s_ == cudaSuccess, cudaGetErrorString(s_))
#define CHECK_LT(x) PROBE_CHECK(x, s_ == CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString(s_))

// p[i] uniform in [lo, hi) (16 bits of a hash of i and the seed), in T (bf16, float).
template <typename T>
__global__ void fill_random(T* p, size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = static_cast<unsigned>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = static_cast<T>(lo + (hi - lo) * ((x & 0xffff) / 65536.0f));
  }
}

// A GEMM's operands for a list of products (anything with m, n, k): bf16 A and B filled by
// fill_random from the two seeds, and an f32 C, each with room for the largest product in any
// orientation.
struct Operands {
  __nv_bfloat16 *a = nullptr, *b = nullptr;
  float* c = nullptr;
};
template <typename Products>
Operands random_operands(const Products& products, unsigned seed_a, unsigned seed_b) {
  size_t elems = 0;
  for (const auto& p : products) elems = std::max({elems, size_t(p.m) * p.k, size_t(p.k) * p.n, size_t(p.m) * p.n});
  Operands o;
  CHECK_CUDA(cudaMalloc(&o.a, elems * 2));
  CHECK_CUDA(cudaMalloc(&o.b, elems * 2));
  CHECK_CUDA(cudaMalloc(&o.c, elems * 4));
  fill_random<<<1024, 256>>>(o.a, elems, seed_a);
  fill_random<<<1024, 256>>>(o.b, elems, seed_b);
  return o;
}

// A product the probes time beside other work: row-major C[m, n] = A[m, k] · B[k, n], bf16 operands,
// C in f32 or bf16.
struct GemmShape {
  const char* name;
  int m, n, k;
  bool f32_out;
};

// One shape's cuBLASLt products on a probe's operands (column-major view of row-major C = A·B:
// Cᵀ[n, m] = Bᵀ[n, k] · Aᵀ[k, m]), timed as a loop of `reps` products (about 5 ms at the ceiling) on
// one stream. Descriptors it made live as long as it does.
class ProbeGemm {
 public:
  ProbeGemm(cublasLtHandle_t lt, const GemmShape& s, const Operands& ops, void* workspace, size_t workspace_bytes,
            cudaStream_t stream)
      : reps(std::max(3, static_cast<int>(5e-3 / (2.0 * s.m * s.n * s.k / 700e12)))),
        lt_(lt),
        ops_(ops),
        workspace_(workspace),
        workspace_bytes_(workspace_bytes),
        stream_(stream) {
    CHECK_LT(cublasLtMatrixLayoutCreate(&la_, CUDA_R_16BF, s.n, s.k, s.n));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb_, CUDA_R_16BF, s.k, s.m, s.k));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc_, s.f32_out ? CUDA_R_32F : CUDA_R_16BF, s.n, s.m, s.n));
    CHECK_CUDA(cudaEventCreate(&e0_));
    CHECK_CUDA(cudaEventCreate(&e1_));
  }
  ~ProbeGemm() {
    for (cublasLtMatmulDesc_t d : descs_) cublasLtMatmulDescDestroy(d);
    cublasLtMatrixLayoutDestroy(la_);
    cublasLtMatrixLayoutDestroy(lb_);
    cublasLtMatrixLayoutDestroy(lc_);
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
  }
  ProbeGemm(const ProbeGemm&) = delete;
  ProbeGemm& operator=(const ProbeGemm&) = delete;

  // The product planned for `sm_target` SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET; 0: every SM).
  cublasLtMatmulDesc_t desc(int sm_target) {
    cublasLtMatmulDesc_t d;
    CHECK_LT(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (sm_target > 0)
      CHECK_LT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target, sizeof(sm_target)));
    descs_.push_back(d);
    return d;
  }
  // The heuristic's first `count` algorithms for d (fewer where it has fewer).
  std::vector<cublasLtMatmulHeuristicResult_t> algos(cublasLtMatmulDesc_t d, int count) {
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                  sizeof(workspace_bytes_)));
    std::vector<cublasLtMatmulHeuristicResult_t> r(count);
    int found = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt_, d, la_, lb_, lc_, lc_, pref, count, r.data(), &found));
    cublasLtMatmulPreferenceDestroy(pref);
    r.resize(found);
    return r;
  }
  // The loop's ms on the stream's clock, waited for.
  float loop_ms(cublasLtMatmulDesc_t d, const cublasLtMatmulAlgo_t& algo) {
    const float alpha = 1, beta = 0;
    CHECK_CUDA(cudaEventRecord(e0_, stream_));
    for (int i = 0; i < reps; ++i)
      CHECK_LT(cublasLtMatmul(lt_, d, &alpha, ops_.b, la_, ops_.a, lb_, &beta, ops_.c, lc_, ops_.c, lc_, &algo,
                              workspace_, workspace_bytes_, stream_));
    CHECK_CUDA(cudaEventRecord(e1_, stream_));
    CHECK_CUDA(cudaEventSynchronize(e1_));
    float ms;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0_, e1_));
    return ms;
  }

  const int reps;

 private:
  cublasLtHandle_t lt_;
  Operands ops_;
  void* workspace_;
  size_t workspace_bytes_;
  cudaStream_t stream_;
  cublasLtMatrixLayout_t la_, lb_, lc_;
  cudaEvent_t e0_, e1_;
  std::vector<cublasLtMatmulDesc_t> descs_;
};
