// Which (sequence, tile) each CTA of the flash-attention kernels takes, and in what order CTAs start.
// Plain C++ as well as CUDA, so that the unit tests check the order on machines without a GPU.
//
// CTAs start roughly in block order, one wave per set of free SMs. Under a causal mask a tile's work
// grows with the number of tiles it sees (the last query tile sees every key tile, the first key tile
// every query tile), so if the heaviest tiles of the last sequences start last, the final wave waits
// on a few long CTAs while most SMs idle (at batch 8 and seq 4096 the attention took 1.2-1.5x as long
// that way: step 23 in docs/log/flash-attention.md). So tiles are ranked by work, 0 the heaviest, and
// sequences go in groups that start rank by rank: rank 0 of every sequence of the group, then rank 1,
// and so on (longest first, the classic list-scheduling rule). A group holds as many sequences as
// keep what their CTAs stream (K and V, or Q and dO) in part of L2, and never fewer than give the GPU
// a few waves of CTAs to balance. The one short group, if the sequences do not divide, goes first,
// away from the tail.
//
// When a call has too few tiles for the GPU (batch 1 up to about 16384 positions), the heaviest
// tiles alone set the time: at batch 1 and seq 8192 the last query tile walks 128 key tiles while
// the average SM has 63 to do. Then each tile's inner loop is cut into `parts` equal parts, one CTA
// each, heaviest tile's parts first; the parts' results go to an fp32 workspace that a second kernel
// adds up in a fixed order, so the result does not depend on which part ran first.
//
// When every CTA of a call is resident at once (batch 1 at seq 16384-32768), nothing is left to hand
// to the SM that finishes first. If the hardware deals blocks to SMs round by round (one each, then
// a second each), ranks 0, 132, 264, ... (the heaviest of each round) share an SM, which then has
// 1.26x the average work with four rounds, 1.5x with two. So every other round is taken in reverse
// (`fold`), pairing each SM's heavy tiles with light ones. Measured on the H100 (step 26 in
// docs/log/flash-attention.md): the Hopper forward at d 64, batch 1, seq 32768 (two rounds) went from
// 0.500 to 0.421 ms, less than this model's 1.5x, so the dealing is only roughly round by round.
#pragma once

#include <algorithm>

#ifdef __CUDACC__
#define LMSCOPE_HOST_DEVICE __host__ __device__
#else
#define LMSCOPE_HOST_DEVICE
#endif

namespace lmscope {

struct CtaTile {
  int seq, rank;  // rank 0: the tile with the most work
  int part = 0;   // which part of the tile's inner loop (see part_of)
};

struct TileOrder {
  int seqs, tiles, group;
  int parts = 1;  // CTAs per tile
  int fold = 0;   // 0, or the SM count: odd rounds of `fold` blocks in reverse (above)

  LMSCOPE_HOST_DEVICE long long ctas() const { return static_cast<long long>(seqs) * tiles * parts; }

  // The tile and part of the block-th CTA (block < ctas()): a tile's parts follow one another.
  LMSCOPE_HOST_DEVICE CtaTile at(int block) const {
    if (fold > 0 && block / fold % 2 == 1) {  // reversed within the round, which may be the short last one
      const int first = block / fold * fold;
      const int last = static_cast<int>(ctas() < first + fold ? ctas() : first + fold);
      block = first + last - 1 - block;
    }
    const int lead = seqs % group, slots = tiles * parts;  // sequences in the short group, first
    int seq, slot;
    if (block < lead * slots) {
      seq = block % lead, slot = block / lead;
    } else {
      const int rest = block - lead * slots, per_group = group * slots, gi = rest / per_group;
      const int at = rest - gi * per_group;
      seq = lead + gi * group + at % group, slot = at / group;
    }
    return {seq, slot / parts, slot % parts};
  }
};

// Part `part` of `parts` of the inner tiles [begin, end): near-equal, in order, possibly empty.
struct TileRange {
  int begin, end;
};
LMSCOPE_HOST_DEVICE inline TileRange part_of(int begin, int end, int part, int parts) {
  const long long n = end > begin ? end - begin : 0;
  return {begin + static_cast<int>(n * part / parts), begin + static_cast<int>(n * (part + 1) / parts)};
}

// Sequences per group (see above) for n sequences of `tiles` tiles whose CTAs stream `streamed` bytes
// each: as many as fit in kL2GroupBytes (half the H100's 50 MB L2), at least kMinGroupCtas CTAs
// (about two waves of one CTA per SM on 132 SMs). With 1,024 (before step 44 in
// docs/log/flash-attention.md) batch 8 at seq 16384 ran all eight sequences at once, and ncu counted
// 2.5-3x the DRAM traffic of groups of three (backward 1.0 against 0.43 GB): no slower at ncu's
// locked clock, but 1.5% slower in fwd+bwd held at the 700 W power cap.
constexpr long long kL2GroupBytes = 24ll << 20, kMinGroupCtas = 256;
inline int tile_group(long long n, long long tiles, long long streamed) {
  const long long fit = kL2GroupBytes / std::max(streamed, 1ll), waves = (kMinGroupCtas + tiles - 1) / tiles;
  return static_cast<int>(std::clamp(std::max(fit, waves), 1ll, std::max(n, 1ll)));
}

// Parts per tile for a kernel whose CTAs walk `work` inner tiles in all, the heaviest `longest`, on
// `slots` CTAs running at once (at most two per SM: more resident CTAs do not make one SM that much
// faster). Parts double while the heaviest part is more than `shares` slots' shares of the work,
// and while a part keeps kMinPartTiles inner tiles. Splitting costs: each part loads its own outer
// tile and writes fp32 results that a second kernel reads back, which weighs most in the forward
// (the least work per tile). Measured on the H100 (docs/log/flash-attention.md, step 25): at batch 8
// and seq 1024, four shares, two parts made the forward slower and the backward 1.3-1.7x faster; at
// batch 1 and seq 8192, eight shares and more, parts made both two to three times faster.
//
// Kernels that hold more than two CTAs per SM (the mma.sync ones at d 16-32) run slower with fewer:
// at batch 1 and seq 32768 their 512 tiles all start at once, the light ones finish, the heavy ones
// run on with the SM's other places empty, and they ran at 58-65% of batch 8's rate. Parts of at
// least kLongPartTiles inner tiles add little (one fp32 partial per 64 tiles walked), so for those
// the rule may count every resident CTA, with two shares in both directions.
constexpr int kMaxParts = 16, kMinPartTiles = 8, kForwardShares = 4, kBackwardShares = 2;
constexpr int kLongPartTiles = 64, kLongPartShares = 2;
inline int split_parts(long long work, long long longest, long long slots, int shares, int min_tiles = kMinPartTiles) {
  int parts = 1;
  while (parts < kMaxParts && longest >= 2ll * parts * min_tiles && longest * slots > shares * parts * work) parts *= 2;
  return parts;
}

}  // namespace lmscope
