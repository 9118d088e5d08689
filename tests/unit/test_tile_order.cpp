// The order in which the flash-attention kernels' CTAs take their tiles (src/lmscope/device/tile_order.h):
// every tile of every sequence exactly once, heaviest first within each group of sequences, groups
// contiguous with the short one first, and group sizes that follow L2 and the wave count; a tile's
// parts together cover its inner loop once, and tiles are cut into parts only when too few; a folded
// wave spreads the work evenly over the SMs.
#include "lmscope/device/tile_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace lmscope::cuda {
namespace {

TEST(TileOrder, EveryTileAndPartOnceHeaviestFirstWithinEachGroup) {
  for (int seqs : {1, 2, 5, 8, 13})
    for (int tiles : {1, 3, 64})
      for (int parts : {1, 2, 3})
        for (int group = 1; group <= seqs; ++group) {
          const TileOrder order{seqs, tiles, group, parts};
          for (int fold : {1, 5, 7, 132}) {  // folded rounds keep every tile and part once
            std::vector<int> once(static_cast<std::size_t>(order.ctas()), 0);
            const TileOrder folded{seqs, tiles, group, parts, fold};
            for (int b = 0; b < order.ctas(); ++b) {
              const CtaTile c = folded.at(b);
              ++once[(static_cast<std::size_t>(c.seq) * tiles + c.rank) * parts + c.part];
            }
            for (int n : once) ASSERT_EQ(n, 1) << seqs << " " << tiles << " " << parts << " fold " << fold;
          }
          const int lead = seqs % group;
          std::vector<int> seen(static_cast<std::size_t>(seqs) * tiles * parts, 0);
          CtaTile before{-1, -1};
          int group_start = -1;
          for (int b = 0; b < order.ctas(); ++b) {
            const CtaTile c = order.at(b);
            ASSERT_TRUE(c.seq >= 0 && c.seq < seqs && c.rank >= 0 && c.rank < tiles && c.part >= 0 && c.part < parts)
                << seqs << " " << tiles << " " << parts << " " << group << " block " << b;
            ++seen[(static_cast<std::size_t>(c.seq) * tiles + c.rank) * parts + c.part];
            // The group this sequence belongs to: the short one [0, lead), then whole groups.
            const int start = c.seq < lead ? 0 : lead + (c.seq - lead) / group * group;
            if (start == group_start) {
              EXPECT_GE(c.rank, before.rank) << "ranks fall within a group at block " << b;
            } else {
              EXPECT_GT(start, group_start) << "groups out of order at block " << b;
              EXPECT_EQ(c.rank, 0) << "a group starts with its heaviest tiles";
            }
            before = c, group_start = start;
          }
          for (int n : seen)
            ASSERT_EQ(n, 1) << seqs << " sequences, " << tiles << " tiles, " << parts << " parts, group " << group;
        }
}

// One wave of CTAs dealt to SMs round by round, block b on SM b % sms (tile_order.h's model of the
// hardware): a causal sequence's tiles, rank r doing tiles − r units, leave the busiest SM 1.26x (512
// tiles) and 1.5x (256) the average work in rank order; folded, within 3.5% (9% with 300 tiles, whose
// short last round pairs less well).
TEST(TileOrder, FoldingOneWaveEvensTheSms) {
  const int sms = 132;
  for (int tiles : {256, 300, 512, 1024}) {
    for (int fold : {0, sms}) {
      const TileOrder order{1, tiles, 1, 1, fold};
      std::vector<long long> load(sms, 0);
      for (int b = 0; b < order.ctas(); ++b) load[b % sms] += tiles - order.at(b).rank;
      const double mean = static_cast<double>(tiles) * (tiles + 1) / 2 / sms;
      const double busiest = static_cast<double>(*std::max_element(load.begin(), load.end())) / mean;
      if (fold)
        EXPECT_LT(busiest, tiles == 300 ? 1.10 : 1.035) << tiles << " tiles";
      else
        EXPECT_GT(busiest, 1.12) << tiles << " tiles";
    }
  }
}

TEST(TileOrder, PartsCoverTheInnerLoopOnceInOrder) {
  for (int begin : {0, 5})
    for (int count : {0, 1, 7, 8, 100})
      for (int parts : {1, 2, 3, 16}) {
        int next = begin, longest = 0, shortest = count;
        for (int p = 0; p < parts; ++p) {
          const TileRange r = part_of(begin, begin + count, p, parts);
          EXPECT_EQ(r.begin, next) << begin << " " << count << " " << parts << " part " << p;
          EXPECT_GE(r.end, r.begin);
          next = r.end;
          longest = std::max(longest, r.end - r.begin), shortest = std::min(shortest, r.end - r.begin);
        }
        EXPECT_EQ(next, begin + count) << begin << " " << count << " " << parts;
        EXPECT_LE(longest - shortest, 1) << "near-equal parts";
      }
  EXPECT_EQ(part_of(3, 1, 0, 2).end, 3) << "an empty loop gives empty parts";
}

TEST(TileOrder, TilesAreCutOnlyWhenTooFew) {
  // Batch 1, seq 8192, causal, 128-row query tiles over 64-key tiles: 64 tiles walking 2..128 key
  // tiles (4160 in all) on 264 slots: the heaviest tile is 8.1 slots' shares. The backward's rule
  // (two shares a part) cuts it in eight parts of 16, the forward's (four) in four of 32.
  EXPECT_EQ(split_parts(4160, 128, 264, kBackwardShares), 8);
  EXPECT_EQ(split_parts(4160, 128, 264, kForwardShares), 4);
  // Batch 8, seq 16384: 1024 tiles, 132096 key tiles in all: the heaviest is half a slot's share.
  EXPECT_EQ(split_parts(132096, 256, 264, kBackwardShares), 1);
  // Batch 8, seq 4096: two shares, left whole.
  EXPECT_EQ(split_parts(8448, 64, 264, kBackwardShares), 1);
  // Batch 1, seq 16384, 128-key tiles over 64-query tiles on 132 slots (16512 in all, at most 256):
  // 2.05 shares, so two parts of 128.
  EXPECT_EQ(split_parts(16512, 256, 132, kBackwardShares), 2);
  // Short loops stay whole: parts keep kMinPartTiles.
  EXPECT_EQ(split_parts(10, 10, 1000, kBackwardShares), 1);
  EXPECT_EQ(split_parts(100, 32, 1000, kBackwardShares), 4);
  EXPECT_LE(split_parts(1, 1ll << 30, 1ll << 20, kBackwardShares), kMaxParts);
  // Long parts over every resident CTA (kernels with more than two per SM). Batch 1, seq 32768,
  // 64-row tiles (512, walking 1..512 tiles, 131328 in all) on 132 SMs × 5: the heaviest is 2.6
  // shares, so two parts of 256; batch 8, seq 8192 (66048 in all, at most 128) stays whole.
  EXPECT_EQ(split_parts(131328, 512, 660, kLongPartShares, kLongPartTiles), 2);
  EXPECT_EQ(split_parts(66048, 128, 660, kLongPartShares, kLongPartTiles), 1);
  // Parts shorter than kLongPartTiles are not made, however few the tiles.
  EXPECT_EQ(split_parts(8256, 128, 660, kLongPartShares, kLongPartTiles), 2);
  EXPECT_EQ(split_parts(2080, 64, 660, kLongPartShares, kLongPartTiles), 1);
}

TEST(TileOrder, GroupSizeFollowsL2AndWaves) {
  // Short sequences: all of them fit in L2 together.
  EXPECT_EQ(tile_group(8, 32, 2 * 4096 * 64 * 2), 8);
  // Long ones (8 MiB of K and V each): three fit in 24 MiB, enough CTAs at 128 tiles each; at 32
  // tiles each a group needs kMinGroupCtas CTAs.
  EXPECT_EQ(tile_group(64, 128, 2 * 16384 * 128 * 2), 3);
  EXPECT_EQ(tile_group(64, 32, 2 * 16384 * 128 * 2), 8);
  // Never more than there are, never fewer than one.
  EXPECT_EQ(tile_group(3, 1, 1), 3);
  EXPECT_EQ(tile_group(1, 1 << 20, 1ll << 40), 1);
}

}  // namespace
}  // namespace lmscope::cuda
