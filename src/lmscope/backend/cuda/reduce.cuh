// Warp and block reductions shared by the row-wise kernels.
#pragma once

#include <cfloat>

namespace lmscope::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Every thread of the block gets the result. blockDim.x must be a multiple of 32, at most 1024.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : (kMax ? -FLT_MAX : 0.0f);
  return kMax ? warp_max(v) : warp_sum(v);
}

__device__ __forceinline__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<true>(v); }

inline unsigned grid_for(long long n, int block) {
  long long g = (n + block - 1) / block;
  return static_cast<unsigned>(g < 65535LL * 32 ? g : 65535LL * 32);
}

}  // namespace lmscope::cuda
