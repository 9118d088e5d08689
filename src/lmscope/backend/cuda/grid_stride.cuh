// The grid-stride loop of the one-pass elementwise and optimizer kernels, and their block size.
#pragma once

#include <cstdint>

namespace lmscope::cuda {

inline constexpr int kBlock = 256;

}  // namespace lmscope::cuda

// i runs over [0, n) across every thread of the grid's x dimension.
#define GRID_STRIDE(i, n)                                                             \
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += std::int64_t{gridDim.x} * blockDim.x)
