// Why a training step's GEMMs slow down beside a collective: NCCL's kernels hold a few SMs for as
// long as they run (one block an SM), and a GEMM planned for every SM then waits on the ones it
// cannot have. This times cuBLASLt GEMMs of the xl and 2.7B steps' shapes alone and while a kernel
// holds `held` SMs the same way (one block an SM, by its shared memory, until the host releases
// it), for: the heuristic's first algorithm, that algorithm asked for the SMs left
// (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), and the fastest beside the held SMs of the heuristic's
// first 8 for that target. Random bf16 operands, fp32 accumulation; medians of 3 runs of a loop.
//
//   gemm_beside_held_sms [held SM counts, default 2,8,24 (24: NCCL's CTAs for two H100s over NVLink)]
#include "probe_support.cuh"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int kHoldSmem = 200 * 1024;  // more than half an SM's shared memory: one block an SM

// Holds its SM for `ns` nanoseconds; each block counts itself in *arrived when it starts.
__global__ void hold_sm(unsigned long long ns, int* arrived) {
  extern __shared__ int smem[];
  if (threadIdx.x == 0) {
    atomicAdd(arrived, 1);
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
      __nanosleep(1000);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
  }
  __syncthreads();
  smem[threadIdx.x] = threadIdx.x;
}

// Runs on the GEMMs' stream before them: they start only once every holding block has.
__global__ void wait_arrived(const volatile int* arrived, int count) {
  while (*arrived < count) __nanosleep(500);
}

struct Shape {
  const char* name;
  int m, n, k;  // row-major C[m, n] = A[m, k] · B[k, n]
  bool f32_out;
};

struct Held {
  cudaStream_t stream;
  int* arrived;
  cudaEvent_t reset;
  // Holds `sms` SMs for `ms` and makes `waiter` wait until they are all held (the count reset first:
  // the wait must not read the previous run's).
  void start(int sms, float ms, cudaStream_t waiter) {
    CHECK_CUDA(cudaMemsetAsync(arrived, 0, sizeof(int), stream));
    CHECK_CUDA(cudaEventRecord(reset, stream));
    CHECK_CUDA(cudaStreamWaitEvent(waiter, reset, 0));
    hold_sm<<<sms, 128, kHoldSmem, stream>>>(static_cast<unsigned long long>(ms * 1e6), arrived);
    CHECK_CUDA(cudaGetLastError());
    wait_arrived<<<1, 1, 0, waiter>>>(arrived, sms);
    CHECK_CUDA(cudaGetLastError());
  }
  void stop() { CHECK_CUDA(cudaStreamSynchronize(stream)); }
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> helds{2, 8, 24};
  if (argc > 1) {
    helds.clear();
    for (std::string s = argv[1]; !s.empty();) {
      helds.push_back(std::atoi(s.c_str()));
      auto comma = s.find(',');
      s = comma == std::string::npos ? "" : s.substr(comma + 1);
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n\n", prop.name, sms);
  CHECK_CUDA(cudaFuncSetAttribute(hold_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, kHoldSmem));

  const int tokens = 4 * 1024;  // batch 4, ctx 1024
  const Shape shapes[] = {
      {"xl attn proj fwd", tokens, 1600, 1600, false},  {"xl ffn up fwd", tokens, 6400, 1600, false},
      {"xl ffn down fwd", tokens, 1600, 6400, false},   {"xl ffn up dgrad", tokens, 1600, 6400, false},
      {"xl ffn up wgrad", 6400, 1600, tokens, true},    {"xl ffn down wgrad", 1600, 6400, tokens, true},
      {"xl attn proj wgrad", 1600, 1600, tokens, true}, {"xl lm head fwd", tokens, 10000, 1600, false},
      {"2.7B ffn up fwd", tokens, 10240, 2560, false},  {"2.7B ffn up wgrad", 10240, 2560, tokens, true},
  };
  const Operands ops = random_operands(shapes, 1, 2);
  __nv_bfloat16 *a = ops.a, *b = ops.b;
  float* c = ops.c;
  size_t workspace_bytes = size_t(32) << 20;
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));

  cudaStream_t fg;
  Held held{};
  CHECK_CUDA(cudaStreamCreateWithFlags(&fg, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&held.stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaMalloc(&held.arrived, sizeof(int)));
  CHECK_CUDA(cudaEventCreateWithFlags(&held.reset, cudaEventDisableTiming));
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));

  std::printf(
      "| shape | held SMs | first algo alone ms | beside | asked for %s SMs left: alone | beside | "
      "fastest beside (of 8): alone | beside |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
      "the");
  for (const Shape& s : shapes) {
    // Column-major view of row-major C = A·B: Cᵀ[n, m] = Bᵀ[n, k] · Aᵀ[k, m].
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.n, s.k, s.n));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, s.m, s.k));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc, s.f32_out ? CUDA_R_32F : CUDA_R_16BF, s.n, s.m, s.n));
    const float alpha = 1, beta = 0;
    const double flop = 2.0 * s.m * s.n * s.k;
    const int reps = std::max(3, static_cast<int>(5e-3 / (flop / 700e12)));  // about 5 ms a loop at the ceiling

    auto desc_for = [&](int target) {
      cublasLtMatmulDesc_t d;
      CHECK_LT(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      if (target > 0)
        CHECK_LT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof(target)));
      return d;
    };
    auto algos_for = [&](cublasLtMatmulDesc_t d, int count) {
      cublasLtMatmulPreference_t pref;
      CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
      CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                    sizeof(workspace_bytes)));
      std::vector<cublasLtMatmulHeuristicResult_t> r(count);
      int found = 0;
      CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, lc, lc, pref, count, r.data(), &found));
      cublasLtMatmulPreferenceDestroy(pref);
      r.resize(found);
      return r;
    };
    auto loop_ms = [&](cublasLtMatmulDesc_t d, const cublasLtMatmulAlgo_t& algo) {
      CHECK_CUDA(cudaEventRecord(e0, fg));
      for (int i = 0; i < reps; ++i)
        CHECK_LT(
            cublasLtMatmul(lt, d, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &algo, workspace, workspace_bytes, fg));
      CHECK_CUDA(cudaEventRecord(e1, fg));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float ms;
      CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      return ms;
    };
    auto time_ms = [&](cublasLtMatmulDesc_t d, const cublasLtMatmulAlgo_t& algo, int hold) {
      // The SMs are held 4x this algorithm's loop alone: a loop slowed up to 4x runs beside them throughout.
      const float hold_ms = hold > 0 ? 4 * loop_ms(d, algo) + 1 : 0;
      std::vector<float> t;
      for (int run = 0; run < 3; ++run) {
        if (hold > 0) held.start(hold, hold_ms, fg);
        const float ms = loop_ms(d, algo);
        if (hold > 0) held.stop();
        if (hold > 0 && ms > hold_ms) std::printf("(a loop outlasted the held SMs: %.2f > %.2f ms)\n", ms, hold_ms);
        t.push_back(ms / reps);
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };

    cublasLtMatmulDesc_t plain = desc_for(0);
    const auto first = algos_for(plain, 1);
    time_ms(plain, first[0].algo, 0);  // warm up
    const float first_alone = time_ms(plain, first[0].algo, 0);
    for (int hold : helds) {
      const float first_beside = time_ms(plain, first[0].algo, hold);
      cublasLtMatmulDesc_t targeted = desc_for(sms - hold);
      const auto candidates = algos_for(targeted, 8);
      const float target_alone = time_ms(targeted, candidates[0].algo, 0);
      const float target_beside = time_ms(targeted, candidates[0].algo, hold);
      float best_beside = 1e30f, best_alone = 0;
      for (const auto& cand : candidates) {
        const float beside = time_ms(targeted, cand.algo, hold);
        if (beside < best_beside) {
          best_beside = beside;
          best_alone = time_ms(targeted, cand.algo, 0);
        }
      }
      std::printf("| %s %dx%dx%d | %d | %.4f | %.4f (%.2fx) | %.4f | %.4f (%.2fx) | %.4f | %.4f (%.2fx) |\n", s.name,
                  s.m, s.n, s.k, hold, first_alone, first_beside, first_beside / first_alone, target_alone,
                  target_beside, target_beside / first_alone, best_alone, best_beside, best_beside / first_alone);
      std::fflush(stdout);
      cublasLtMatmulDescDestroy(targeted);
    }
    cublasLtMatmulDescDestroy(plain);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
  }
  std::printf("\n(ratios against the first algorithm alone)\n");
  return 0;
}
