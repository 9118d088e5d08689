// Tiles cut into parts (tile_order.h): adding the parts' dK, dV or dQ, and combining the parts'
// outputs and log-sum-exps, in part order, so the result does not depend on which CTA ran first.
// Part of flash_attention.cu's one translation unit: included there only, in order, so that its
// launchers instantiate these templates and the kernels compile as one unit.
#pragma once

#include "lmscope/backend/cuda/flash/ptx.cuh"

namespace lmscope::cuda {
namespace {

// out = Σ_p parts[p] over `count` slices of `slice` floats, in E: one thread per four elements,
// added in part order, so the sum does not depend on which part's CTA ran first.
template <typename E>
__global__ void add_parts(const float* __restrict__ parts, int count, long long slice, E* __restrict__ out) {
  const long long i = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i >= slice) return;
  float4 a = *reinterpret_cast<const float4*>(parts + i);
  for (int p = 1; p < count; ++p) {
    const float4 b = *reinterpret_cast<const float4*>(parts + p * slice + i);
    a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
  }
  store_pair(out + i, a.x, a.y);
  store_pair(out + i + 2, a.z, a.w);
}

// The forward's O and L from its parts, each normalised over its own keys (O_p, L_p):
// L = log Σ_p e^{L_p}, O = Σ_p e^{L_p − L}·O_p. One warp per row; lane p < count holds L_p.
template <typename E>
__global__ void combine_parts(const float* __restrict__ o_parts, const float* __restrict__ lse_parts, int count,
                              long long rows, int d, E* __restrict__ o, float* __restrict__ lse) {
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const float own = lane < count ? lse_parts[lane * rows + row] : -INFINITY;
  float mx = own;
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  const float w = mx == -INFINITY ? 0.f : expf(own - mx);  // −∞: a part that saw no key of this row
  float sum = w;
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  float weight[kMaxParts];
#pragma unroll
  for (int p = 0; p < kMaxParts; ++p) weight[p] = __shfl_sync(0xffffffffu, w, p) * inv;
  if (lane == 0) lse[row] = mx + logf(sum);
  for (int c = 2 * lane; c < d; c += 64) {
    float x = 0.f, y = 0.f;
#pragma unroll
    for (int p = 0; p < kMaxParts; ++p)
      if (p < count) {
        const float2 part = *reinterpret_cast<const float2*>(o_parts + (p * rows + row) * d + c);
        x += weight[p] * part.x, y += weight[p] * part.y;
      }
    store_pair(o + row * d + c, x, y);
  }
}

}  // namespace
}  // namespace lmscope::cuda
