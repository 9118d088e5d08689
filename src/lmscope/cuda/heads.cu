// Head split/merge with RoPE: one thread per interleaved pair. The rotation angles come from a
// table of cos and sin per (position, pair), formed once in double as the CPU reference forms them:
// evaluating pow and sincos in double for every pair made this kernel six times slower than its
// memory traffic.
#include "lmscope/cuda/kernels.h"
#include "lmscope/cuda/launch_check.cuh"
#include "lmscope/cuda/reduce.cuh"
#include "lmscope/cuda/storage.cuh"

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

}  // namespace

void rope_table(float* table, std::int64_t t, std::int64_t dk, double theta, cudaStream_t s) {
  rope_table_kernel<<<grid_for(t * (dk / 2), 256), 256, 0, s>>>(reinterpret_cast<float2*>(table), t, dk, theta);
  check_launch("rope_table_kernel");
}

void permute_heads(const void* in, void* out, Elem e, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t dk,
                   const float* rope, bool to_heads_major, cudaStream_t s) {
  constexpr int kThreads = 128;
  const dim3 grid(static_cast<unsigned>(b * t), static_cast<unsigned>((h * (dk / 2) + kThreads - 1) / kThreads));
  with_elem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    permute_heads_kernel<T><<<grid, kThreads, 0, s>>>(
        static_cast<const T*>(in), static_cast<T*>(out), t, static_cast<int>(h), static_cast<int>(dk),
        reinterpret_cast<const float2*>(rope), to_heads_major, to_heads_major ? 1.0f : -1.0f);
  });
  check_launch("permute_heads_kernel");
}

}  // namespace lmscope::cuda
