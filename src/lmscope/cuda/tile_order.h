// Which (sequence, tile) each CTA of the flash-attention kernels takes, and in what order CTAs start.
// Plain C++ as well as CUDA, so that the unit tests check the order on machines without a GPU.
//
// CTAs start roughly in block order, one wave per set of free SMs. Under a causal mask a tile's work
// grows with the number of tiles it sees (the last query tile sees every key tile, the first key tile
// every query tile), so if the heaviest tiles of the last sequences start last, the final wave waits
// on a few long CTAs while most SMs idle (at batch 8 and seq 4096 the attention took 1.2-1.5x as long
// that way: step 23 in docs/flash-attention.md). So tiles are ranked by work, 0 the heaviest, and
// sequences go in groups that start rank by rank: rank 0 of every sequence of the group, then rank 1,
// and so on (longest first, the classic list-scheduling rule). A group holds as many sequences as
// keep what their CTAs stream (K and V, or Q and dO) in part of L2, and never fewer than give the GPU
// a few waves of CTAs to balance. The one short group, if the sequences do not divide, goes first,
// away from the tail.
#pragma once

#include <algorithm>

#ifdef __CUDACC__
#define LMSCOPE_HOST_DEVICE __host__ __device__
#else
#define LMSCOPE_HOST_DEVICE
#endif

namespace lmscope::cuda {

struct CtaTile {
  int seq, rank;  // rank 0: the tile with the most work
};

struct TileOrder {
  int seqs, tiles, group;

  LMSCOPE_HOST_DEVICE long long ctas() const { return static_cast<long long>(seqs) * tiles; }

  // The tile of the block-th CTA (block < ctas()).
  LMSCOPE_HOST_DEVICE CtaTile at(int block) const {
    const int lead = seqs % group;  // sequences in the short group, first
    if (block < lead * tiles) return {block % lead, block / lead};
    const int rest = block - lead * tiles, per_group = group * tiles, gi = rest / per_group, at = rest - gi * per_group;
    return {lead + gi * group + at % group, at / group};
  }
};

// Sequences per group (see above) for n sequences of `tiles` tiles whose CTAs stream `streamed` bytes
// each: as many as fit in kL2GroupBytes (half the H100's 50 MB L2), at least kMinGroupCtas CTAs
// (about four waves of two CTAs per SM on 132 SMs).
constexpr long long kL2GroupBytes = 24ll << 20, kMinGroupCtas = 1024;
inline int tile_group(long long n, long long tiles, long long streamed) {
  const long long fit = kL2GroupBytes / std::max(streamed, 1ll), waves = (kMinGroupCtas + tiles - 1) / tiles;
  return static_cast<int>(std::clamp(std::max(fit, waves), 1ll, std::max(n, 1ll)));
}

}  // namespace lmscope::cuda
