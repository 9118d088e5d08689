// How a launch over many tensors (fused AdamW, the batched cast of weight copies) spreads its blocks:
// each block takes one chunk of kBlock units (a unit is one thread's work: a 16-byte vector, or a
// tail element) of one tensor, so every block has work. A grid with one row of blocks per tensor,
// each as wide as the largest tensor needs, idled most of its blocks when the sizes differ (a layer's
// norm weights beside its FFN weights): measured at 3.90 TB/s for AdamW against 4.26 chunked
// (tools/adamw_bandwidth.cu, docs/speed.md).
#pragma once

#include "lmscope/backend/cuda/grid_stride.cuh"
#include "lmscope/backend/cuda/kernels.h"

#include <cstdint>
#include <limits>
#include <stdexcept>

namespace lmscope::cuda {

// The running count of chunks through each tensor of a launch: tensor k owns blocks
// [end[k-1], end[k]).
struct ChunkEnds {
  std::int64_t end[kTensorsPerLaunch];
};

// Fills `ends` from each tensor's units and returns the blocks the launch takes.
inline unsigned chunk_ends(const std::int64_t* units, int count, ChunkEnds& ends) {
  std::int64_t blocks = 0;
  for (int k = 0; k < count; ++k) {
    blocks += (units[k] + kBlock - 1) / kBlock;
    ends.end[k] = blocks;
  }
  if (blocks > std::numeric_limits<int>::max()) throw std::invalid_argument("multi-tensor launch: too many blocks");
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

#ifdef __CUDACC__
// This block's tensor (its chunk's owner) and this thread's unit in it; the unit may lie past the
// tensor's last (the chunk's tail), and every tensor's units start at 0.
struct ChunkPlace {
  int tensor;
  std::int64_t unit;
};
__device__ __forceinline__ ChunkPlace chunk_place(const ChunkEnds& ends, int count) {
  const std::int64_t block = blockIdx.x;
  int k = 0;
  while (k + 1 < count && block >= ends.end[k]) ++k;
  return {k, (block - (k ? ends.end[k - 1] : 0)) * kBlock + threadIdx.x};  // launched with kBlock threads
}
#endif

}  // namespace lmscope::cuda
