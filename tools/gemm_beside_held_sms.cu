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
  const GemmShape shapes[] = {
      {"xl attn proj fwd", tokens, 1600, 1600, false},  {"xl ffn up fwd", tokens, 6400, 1600, false},
      {"xl ffn down fwd", tokens, 1600, 6400, false},   {"xl ffn up dgrad", tokens, 1600, 6400, false},
      {"xl ffn up wgrad", 6400, 1600, tokens, true},    {"xl ffn down wgrad", 1600, 6400, tokens, true},
      {"xl attn proj wgrad", 1600, 1600, tokens, true}, {"xl lm head fwd", tokens, 10000, 1600, false},
      {"2.7B ffn up fwd", tokens, 10240, 2560, false},  {"2.7B ffn up wgrad", 10240, 2560, tokens, true},
  };
  const Operands ops = random_operands(shapes, 1, 2);
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

  std::printf(
      "| shape | held SMs | first algo alone ms | beside | asked for %s SMs left: alone | beside | "
      "fastest beside (of 8): alone | beside |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
      "the");
  for (const GemmShape& s : shapes) {
    ProbeGemm gemm(lt, s, ops, workspace, workspace_bytes, fg);
    auto time_ms = [&](cublasLtMatmulDesc_t d, const cublasLtMatmulAlgo_t& algo, int hold) {
      // The SMs are held 4x this algorithm's loop alone: a loop slowed up to 4x runs beside them throughout.
      const float hold_ms = hold > 0 ? 4 * gemm.loop_ms(d, algo) + 1 : 0;
      std::vector<float> t;
      for (int run = 0; run < 3; ++run) {
        if (hold > 0) held.start(hold, hold_ms, fg);
        const float ms = gemm.loop_ms(d, algo);
        if (hold > 0) held.stop();
        if (hold > 0 && ms > hold_ms) std::printf("(a loop outlasted the held SMs: %.2f > %.2f ms)\n", ms, hold_ms);
        t.push_back(ms / gemm.reps);
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };

    cublasLtMatmulDesc_t plain = gemm.desc(0);
    const auto first = gemm.algos(plain, 1);
    time_ms(plain, first[0].algo, 0);  // warm up
    const float first_alone = time_ms(plain, first[0].algo, 0);
    for (int hold : helds) {
      const float first_beside = time_ms(plain, first[0].algo, hold);
      cublasLtMatmulDesc_t targeted = gemm.desc(sms - hold);
      const auto candidates = gemm.algos(targeted, 8);
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
    }
  }
  std::printf("\n(ratios against the first algorithm alone)\n");
  return 0;
}
