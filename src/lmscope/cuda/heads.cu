// Head split/merge with RoPE. The rotation angles come from a table of cos and sin per (position,
// pair), formed once in double as the CPU reference forms them: evaluating pow and sincos in double
// for every pair made this kernel six times slower than its memory traffic. Each thread moves 16
// bytes (a few interleaved pairs) where the rows allow: one pair a thread, 4 bytes in bf16, kept the
// kernel at 40% of the memory's bandwidth (docs/speed.md).
#include "lmscope/cuda/kernels.h"
#include "lmscope/cuda/launch_check.cuh"
#include "lmscope/cuda/reduce.cuh"
#include "lmscope/cuda/storage.cuh"

#include <algorithm>

namespace lmscope::cuda {
namespace {

__global__ void rope_table_kernel(float2* table, std::int64_t t, std::int64_t dk, double theta) {
  const std::int64_t pairs = dk / 2;
  for (std::int64_t idx = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; idx < t * pairs;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t p = idx / pairs, i = idx % pairs;
    double sn, cs;
    sincos(static_cast<double>(p) * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dk)), &sn, &cs);
    table[idx] = make_float2(static_cast<float>(cs), static_cast<float>(sn));
  }
}

// A pair of neighbouring elements as one load and one store.
__device__ __forceinline__ float2 ld2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 ld2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ void st2(float* p, float2 v) { *reinterpret_cast<float2*>(p) = v; }
__device__ __forceinline__ float2 ld2(const __half* p) { return __half22float2(*reinterpret_cast<const __half2*>(p)); }
__device__ __forceinline__ void st2(__half* p, float2 v) { *reinterpret_cast<__half2*>(p) = __float22half2_rn(v); }
__device__ __forceinline__ void st2(__nv_bfloat16* p, float2 v) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __float22bfloat162_rn(v);
}

// One block row per token (b, t), its threads over the token's h·dk/2 pairs: the only divisions
// left are one 32-bit divide per pair (64-bit index arithmetic per element cost more than the
// memory traffic). rope: [T, dk/2] (cos, sin), or nullptr for no rotation; sign −1 undoes the
// rotation (backward).
template <typename E>
__global__ void permute_heads_kernel(const E* in, E* out, std::int64_t T, int H, int dk, const float2* rope,
                                     bool to_heads_major, float sign) {
  const int pairs = dk / 2, j = blockIdx.y * blockDim.x + threadIdx.x;
  if (j >= H * pairs) return;
  const std::int64_t token = blockIdx.x, b = token / T, t = token % T;
  const int h = j / pairs, i = j - h * pairs;
  const std::int64_t token_major = token * H * dk + 2 * j, head_major = ((b * H + h) * T + t) * dk + 2 * i;
  const float2 x = ld2(in + (to_heads_major ? token_major : head_major));
  E* y = out + (to_heads_major ? head_major : token_major);
  if (!rope) {
    st2(y, x);
    return;
  }
  const float2 cs = rope[t * pairs + i];
  const float c = cs.x, s = sign * cs.y;
  st2(y, make_float2(x.x * c - x.y * s, x.x * s + x.y * c));
}

// The same, P pairs (16 bytes) a thread: rows of dk elements, dk a multiple of 2P, both buffers
// 16-byte aligned. The arithmetic per pair is the one-pair kernel's, so the bits are too.
template <typename E, int P>
__global__ void permute_heads_vec_kernel(const E* in, E* out, std::int64_t T, int H, int dk, const float2* rope,
                                         bool to_heads_major, float sign) {
  const int pairs = dk / 2, groups = pairs / P, j = blockIdx.y * blockDim.x + threadIdx.x;
  if (j >= H * groups) return;
  const std::int64_t token = blockIdx.x, b = token / T, t = token % T;
  const int h = j / groups, i = (j - h * groups) * P;
  const std::int64_t token_major = token * H * dk + 2 * (h * pairs + i),
                     head_major = ((b * H + h) * T + t) * dk + 2 * i;
  union Pack {
    uint4 raw;
    E e[2 * P];
  } x, y;
  x.raw = *reinterpret_cast<const uint4*>(in + (to_heads_major ? token_major : head_major));
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const float2 v = ld2(&x.e[2 * k]);
    if (!rope) {
      st2(&y.e[2 * k], v);
      continue;
    }
    const float2 cs = rope[t * pairs + i + k];
    const float c = cs.x, s = sign * cs.y;
    st2(&y.e[2 * k], make_float2(v.x * c - v.y * s, v.x * s + v.y * c));
  }
  *reinterpret_cast<uint4*>(out + (to_heads_major ? head_major : token_major)) = y.raw;
}

}  // namespace

void rope_table(float* table, std::int64_t t, std::int64_t dk, double theta, cudaStream_t s) {
  rope_table_kernel<<<grid_for(t * (dk / 2), 256), 256, 0, s>>>(reinterpret_cast<float2*>(table), t, dk, theta);
  check_launch("rope_table_kernel");
}

void permute_heads(const void* in, void* out, Elem e, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t dk,
                   const float* rope, bool to_heads_major, cudaStream_t s) {
  with_elem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kPairs = 16 / (2 * sizeof(T));  // pairs in 16 bytes
    const auto* table = reinterpret_cast<const float2*>(rope);
    const float sign = to_heads_major ? 1.0f : -1.0f;
    if (dk % (2 * kPairs) == 0 && aligned16({in, out})) {
      // One block per token, as many threads as its 16-byte groups (rounded to whole warps, at most 256).
      const std::int64_t groups = h * dk / (2 * kPairs);
      const int threads = static_cast<int>(std::min<std::int64_t>(256, (groups + 31) / 32 * 32));
      const dim3 grid(static_cast<unsigned>(b * t), static_cast<unsigned>((groups + threads - 1) / threads));
      permute_heads_vec_kernel<T, kPairs><<<grid, threads, 0, s>>>(static_cast<const T*>(in), static_cast<T*>(out), t,
                                                                   static_cast<int>(h), static_cast<int>(dk), table,
                                                                   to_heads_major, sign);
      check_launch("permute_heads_vec_kernel");
      return;
    }
    constexpr int kThreads = 128;
    const dim3 grid(static_cast<unsigned>(b * t), static_cast<unsigned>((h * (dk / 2) + kThreads - 1) / kThreads));
    permute_heads_kernel<T><<<grid, kThreads, 0, s>>>(static_cast<const T*>(in), static_cast<T*>(out), t,
                                                      static_cast<int>(h), static_cast<int>(dk), table, to_heads_major,
                                                      sign);
    check_launch("permute_heads_kernel");
  });
}

}  // namespace lmscope::cuda
