// What the standalone GPU probes (gemm_algorithms, gemm_beside_held_sms, nccl_symmetric_beside_gemm)
// share: checks that print and exit, and random bf16 operands. Kept apart from src/ so the probes build with nvcc alone.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

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

// p[i] uniform in [-1, 1), from a hash of i and the seed.
__global__ void fill_random(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = static_cast<unsigned>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = __float2bfloat16((x & 0xffff) / 32768.0f - 1.0f);
  }
}
