// Which traffic slows a GEMM beside a gradient all-reduce: the backward of a two-GPU step runs 20-25%
// longer beside NCCL's symmetric all-reduce (docs/distributed.md), more than the 7 SMs it holds
// explain (gemm_beside_held_sms). Here GPU 0 runs cuBLASLt GEMMs of the xl and 2.7B steps' shapes
// alone and beside a loop of one kind of traffic, moved by `blocks` blocks (default 8, as many SMs as
// the exchange holds) in 16-byte loads and stores:
//   local copy       GPU 0's blocks copy within GPU 0's memory (its HBM and L2, no NVLink);
//   peer reads       GPU 1's blocks read GPU 0's memory over NVLink (GPU 0's SMs untouched);
//   peer writes      GPU 1's blocks write into GPU 0's memory;
//   own reads        GPU 0's blocks read GPU 1's memory;
//   both ways        peer reads and own reads at once, as the all-reduce's two ranks load each other's;
// each first alone (its rate, and a check that the copy arrived), then beside each GEMM, as the GEMM
// asked for every SM and for `blocks` SMs fewer (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET). Random bf16
// operands, the heuristic's first algorithm, medians of 3 runs of a loop. Needs peer access.
//
//   gemm_beside_traffic [blocks, default 8] [MiB a copy, default 256]
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

__global__ void copy16(const int4* src, int4* dst, size_t n, int times) {
  for (int t = 0; t < times; ++t)
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
      dst[i] = src[i];
}

__global__ void count_different(const int4* a, const int4* b, size_t n, unsigned long long* wrong) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (a[i].x != b[i].x || a[i].y != b[i].y || a[i].z != b[i].z || a[i].w != b[i].w) atomicAdd(wrong, 1ull);
}

const GemmShape kShapes[] = {
    {"xl ffn up fwd", 4096, 6400, 1600, false},
    {"xl ffn up wgrad", 6400, 1600, 4096, true},
    {"2.7B ffn up wgrad", 10240, 2560, 4096, true},
};

// One copy kernel's place: the device it runs on, where it reads and where it writes.
struct Leg {
  int device;
  const int4* src;
  int4* dst;
};
struct Traffic {
  const char* name;
  std::vector<Leg> legs;
};

float median3(std::vector<float> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? std::atoi(argv[1]) : 8;
  const size_t bytes = size_t(argc > 2 ? std::atof(argv[2]) : 256.0) * 1048576;
  const size_t n16 = bytes / 16;
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    std::fprintf(stderr, "needs two GPUs, found %d\n", devices);
    return 1;
  }
  int can01 = 0, can10 = 0;
  CHECK_CUDA(cudaDeviceCanAccessPeer(&can01, 0, 1));
  CHECK_CUDA(cudaDeviceCanAccessPeer(&can10, 1, 0));
  if (!can01 || !can10) {
    std::fprintf(stderr, "GPUs 0 and 1 have no peer access to each other\n");
    return 1;
  }
  // Per device: a source filled at random, a destination, a stream for the traffic, and a flag.
  int4 *src[2], *dst[2];
  cudaStream_t traffic[2];
  cudaEvent_t t0[2], t1[2];
  unsigned long long* wrong[2];
  for (int d = 0; d < 2; ++d) {
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaDeviceEnablePeerAccess(1 - d, 0));
    CHECK_CUDA(cudaMalloc(&src[d], bytes));
    CHECK_CUDA(cudaMalloc(&dst[d], bytes));
    CHECK_CUDA(cudaMalloc(&wrong[d], sizeof(unsigned long long)));
    fill_random<<<1024, 256>>>(reinterpret_cast<float*>(src[d]), bytes / 4, 11 + d);
    CHECK_CUDA(cudaStreamCreateWithFlags(&traffic[d], cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreate(&t0[d]));
    CHECK_CUDA(cudaEventCreate(&t1[d]));
  }
  const std::vector<Traffic> kinds = {
      {"local copy", {{0, src[0], dst[0]}}},
      {"peer reads", {{1, src[0], dst[1]}}},
      {"peer writes", {{1, src[1], dst[0]}}},
      {"own reads", {{0, src[1], dst[0]}}},
      {"both ways", {{1, src[0], dst[1]}, {0, src[1], dst[0]}}},
  };
  // Starts every leg of a kind `times` over on its device's traffic stream (t0..t1 around each).
  auto start = [&](const Traffic& k, int times) {
    for (const Leg& l : k.legs) {
      CHECK_CUDA(cudaSetDevice(l.device));
      CHECK_CUDA(cudaEventRecord(t0[l.device], traffic[l.device]));
      copy16<<<blocks, 512, 0, traffic[l.device]>>>(l.src, l.dst, n16, times);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaEventRecord(t1[l.device], traffic[l.device]));
    }
    CHECK_CUDA(cudaSetDevice(0));
  };
  // The slowest leg's span, once all have ended.
  auto finish_ms = [&](const Traffic& k) {
    float worst = 0;
    for (const Leg& l : k.legs) {
      CHECK_CUDA(cudaSetDevice(l.device));
      CHECK_CUDA(cudaEventSynchronize(t1[l.device]));
      float ms;
      CHECK_CUDA(cudaEventElapsedTime(&ms, t0[l.device], t1[l.device]));
      worst = std::max(worst, ms);
    }
    CHECK_CUDA(cudaSetDevice(0));
    return worst;
  };

  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s x2, %d blocks of 512 threads move each kind of traffic, %.0f MiB a pass\n\n", prop.name, blocks,
              bytes / 1048576.0);
  std::printf("| traffic | alone GB/s (each leg) | copies wrong |\n|---|---:|---:|\n");
  std::vector<float> pass_ms;  // per kind, one pass alone
  for (const Traffic& k : kinds) {
    start(k, 1);  // warm up
    finish_ms(k);
    start(k, 3);
    const float ms = finish_ms(k) / 3;
    pass_ms.push_back(ms);
    unsigned long long bad = 0;
    for (const Leg& l : k.legs) {
      CHECK_CUDA(cudaSetDevice(l.device));
      CHECK_CUDA(cudaMemset(wrong[l.device], 0, sizeof bad));
      count_different<<<1024, 256>>>(l.src, l.dst, n16, wrong[l.device]);
      unsigned long long here = 0;
      CHECK_CUDA(cudaMemcpy(&here, wrong[l.device], sizeof here, cudaMemcpyDeviceToHost));
      bad += here;
    }
    CHECK_CUDA(cudaSetDevice(0));
    std::printf("| %s | %.0f | %llu |\n", k.name, bytes / (ms * 1e-3) / 1e9, bad);
  }

  CHECK_CUDA(cudaSetDevice(0));
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const Operands ops = random_operands(kShapes, 1, 7);
  size_t workspace_bytes = size_t(32) << 20;
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  cudaStream_t fg;
  CHECK_CUDA(cudaStreamCreateWithFlags(&fg, cudaStreamNonBlocking));

  std::printf("\nGEMMs on GPU 0, ms a product, the heuristic's first algorithm; beside: ratio to alone\n\n");
  std::printf("| GEMM | SMs asked | alone ms |");
  for (const Traffic& k : kinds) std::printf(" %s |", k.name);
  std::printf("\n|---|---:|---:|");
  for (size_t i = 0; i < kinds.size(); ++i) std::printf("---:|");
  std::printf("\n");
  for (const GemmShape& s : kShapes) {
    ProbeGemm gemm(lt, s, ops, workspace, workspace_bytes, fg);
    for (int target : {0, sms - blocks}) {
      cublasLtMatmulDesc_t d = gemm.desc(target);
      const auto first = gemm.algos(d, 1);
      if (first.empty()) continue;
      gemm.loop_ms(d, first[0].algo);  // warm up
      std::vector<float> t;
      for (int run = 0; run < 3; ++run) t.push_back(gemm.loop_ms(d, first[0].algo));
      const float alone = median3(t);
      std::printf("| %s %dx%dx%d | %s | %.4f |", s.name, s.m, s.n, s.k, target ? std::to_string(target).c_str() : "all",
                  alone / gemm.reps);
      for (size_t k = 0; k < kinds.size(); ++k) {
        // Traffic for about 4x the GEMM loop, started first; a loop it did not outlast is marked.
        const int times = std::max(1, static_cast<int>(4 * alone / pass_ms[k]) + 1);
        t.clear();
        bool outlasted = false;
        for (int run = 0; run < 3; ++run) {
          start(kinds[k], times);
          t.push_back(gemm.loop_ms(d, first[0].algo));
          outlasted |= finish_ms(kinds[k]) < t.back();
        }
        std::printf(" %.2fx%s |", median3(t) / alone, outlasted ? " (traffic ended first)" : "");
      }
      std::printf("\n");
    }
  }
  return 0;
}
