// What the standalone GPU probes (gemm_algorithms, gemm_beside_held_sms, gemm_beside_traffic,
// nccl_symmetric_beside_gemm, adamw_bandwidth, pdl_chain) share: checks that print and exit, random
// fills, and bf16 operands for the GEMM probes. Kept apart from src/ so the probes build with nvcc
// alone.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
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
