// The plan's search: the largest multiple that fits, found in about 2·log2 probes, at the edges too.
#include "lmscope/memory/plan.h"

#include <gtest/gtest.h>

namespace lmscope::test {
namespace {

TEST(Plan, LargestFittingFindsTheLastMultipleBelowTheThreshold) {
  for (std::int64_t threshold : {128, 129, 255, 256, 1000, 4096, 4097, 123456}) {
    int probes = 0;
    const std::int64_t got = largest_fitting(128, std::int64_t(1) << 22, [&](std::int64_t n) {
      ++probes;
      return n <= threshold;
    });
    EXPECT_EQ(got, threshold / 128 * 128) << threshold;
    EXPECT_LE(probes, 2 * 15 + 2) << threshold;
  }
}

TEST(Plan, LargestFittingAtTheEdges) {
  EXPECT_EQ(largest_fitting(128, 4096, [](std::int64_t) { return false; }), 0);  // nothing fits
  EXPECT_EQ(largest_fitting(128, 4096, [](std::int64_t) { return true; }), 4096);
  EXPECT_EQ(largest_fitting(100, 1050, [](std::int64_t) { return true; }), 1000);  // the cap is not a multiple
  EXPECT_EQ(largest_fitting(1, 1, [](std::int64_t) { return true; }), 1);
  EXPECT_EQ(largest_fitting(1, 1 << 16, [](std::int64_t n) { return n < 3; }), 2);
}

}  // namespace
}  // namespace lmscope::test
