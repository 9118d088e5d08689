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

// P interleaved pairs (2P elements) a thread, moved as one load and one store: 16 bytes' worth where
// dk and the buffers allow, else one pair. One block row per token (b, t), its threads over the
// token's h·dk/(2P) groups: the only divisions left are one 32-bit divide per group (64-bit index
// arithmetic per element cost more than the memory traffic). rope: [T, dk/2] (cos, sin), or nullptr
// for no rotation; sign −1 undoes the rotation (backward). Every P does the same arithmetic per pair,
// so gives the same bits.
template <typename E, int P>
__global__ void permute_heads_kernel(const E* in, E* out, std::int64_t T, int H, int dk, const float2* rope,
                                     bool to_heads_major, float sign) {
  const int pairs = dk / 2, groups = pairs / P, j = blockIdx.y * blockDim.x + threadIdx.x;
  if (j >= H * groups) return;
  const std::int64_t token = blockIdx.x, b = token / T, t = token % T;
  const int h = j / groups, i = (j - h * groups) * P;
  const std::int64_t token_major = token * H * dk + 2 * (h * pairs + i),
                     head_major = ((b * H + h) * T + t) * dk + 2 * i;
  float x[2 * P];
  load<2 * P>(in + (to_heads_major ? token_major : head_major), x);
  if (rope) {
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float2 cs = rope[t * pairs + i + k];
      const float c = cs.x, s = sign * cs.y, re = x[2 * k], im = x[2 * k + 1];
      x[2 * k] = re * c - im * s;
      x[2 * k + 1] = re * s + im * c;
    }
  }
  store<2 * P>(out + (to_heads_major ? head_major : token_major), x);
}

template <typename E, int P>
void launch_permute_heads(const E* in, E* out, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t dk,
                          const float2* rope, bool to_heads_major, cudaStream_t s) {
  // One block per token, as many threads as its groups (rounded to whole warps, at most 256).
  const std::int64_t groups = h * dk / (2 * P);
  if (groups == 0 || b * t == 0) return;  // nothing to move (and no grid of zero blocks)
  const int threads = static_cast<int>(std::min<std::int64_t>(256, (groups + 31) / 32 * 32));
  const dim3 grid(static_cast<unsigned>(b * t), static_cast<unsigned>((groups + threads - 1) / threads));
  permute_heads_kernel<E, P><<<grid, threads, 0, s>>>(in, out, t, static_cast<int>(h), static_cast<int>(dk), rope,
                                                      to_heads_major, to_heads_major ? 1.0f : -1.0f);
  check_launch("permute_heads_kernel");
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
    constexpr int kPairs = kPack<T> / 2;  // pairs in 16 bytes
    const auto* table = reinterpret_cast<const float2*>(rope);
    const auto* x = static_cast<const T*>(in);
    auto* y = static_cast<T*>(out);
    if (dk % (2 * kPairs) == 0 && aligned16({in, out}))
      launch_permute_heads<T, kPairs>(x, y, b, t, h, dk, table, to_heads_major, s);
    else
      launch_permute_heads<T, 1>(x, y, b, t, h, dk, table, to_heads_major, s);
  });
}

}  // namespace lmscope::cuda
