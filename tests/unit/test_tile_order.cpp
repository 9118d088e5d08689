// The order in which the flash-attention kernels' CTAs take their tiles (src/lmscope/cuda/tile_order.h):
// every tile of every sequence exactly once, heaviest first within each group of sequences, groups
// contiguous with the short one first, and group sizes that follow L2 and the wave count.
#include "lmscope/cuda/tile_order.h"

#include <gtest/gtest.h>

#include <vector>

namespace lmscope::cuda {
namespace {

TEST(TileOrder, EveryTileOnceHeaviestFirstWithinEachGroup) {
  for (int seqs : {1, 2, 5, 8, 13})
    for (int tiles : {1, 3, 64})
      for (int group = 1; group <= seqs; ++group) {
        const TileOrder order{seqs, tiles, group};
        const int lead = seqs % group;
        std::vector<int> seen(static_cast<std::size_t>(seqs) * tiles, 0);
        CtaTile before{-1, -1};
        int group_start = -1;
        for (int b = 0; b < order.ctas(); ++b) {
          const CtaTile c = order.at(b);
          ASSERT_TRUE(c.seq >= 0 && c.seq < seqs && c.rank >= 0 && c.rank < tiles)
              << seqs << " " << tiles << " " << group << " block " << b;
          ++seen[static_cast<std::size_t>(c.seq) * tiles + c.rank];
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
        for (int n : seen) ASSERT_EQ(n, 1) << seqs << " sequences, " << tiles << " tiles, group " << group;
      }
}

TEST(TileOrder, GroupSizeFollowsL2AndWaves) {
  // Short sequences: all of them fit in L2 together.
  EXPECT_EQ(tile_group(8, 32, 2 * 4096 * 64 * 2), 8);
  // Long ones (8 MiB of K and V each): three fit in 24 MiB, but a group needs kMinGroupCtas CTAs.
  EXPECT_EQ(tile_group(64, 128, 2 * 16384 * 128 * 2), 8);
  EXPECT_EQ(tile_group(64, 1024, 2 * 16384 * 128 * 2), 3);
  // Never more than there are, never fewer than one.
  EXPECT_EQ(tile_group(3, 1, 1), 3);
  EXPECT_EQ(tile_group(1, 1 << 20, 1ll << 40), 1);
}

}  // namespace
}  // namespace lmscope::cuda
