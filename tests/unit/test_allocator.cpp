// The caching allocator's policy: best fit within a pool, splitting and merging, segments given
// back only when wholly free, and a record that replays to the allocator's own numbers.
#include "lmscope/core/allocator.h"
#include "lmscope/memory/memory_analysis.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace lmscope::test {
namespace {

constexpr std::size_t kMiB = std::size_t(1) << 20;

Allocation floats(Allocator& a, std::int64_t n, const char* what) {
  return a.allocate({n}, DType::f32, {MemKind::activation, what, -1});
}

TEST(Allocator, RefusesMoreThanItsCapacity) {
  HostAllocator a(3 * kMiB);
  EXPECT_THROW(floats(a, 1 << 20, "big"), OutOfMemory);  // 4 MiB
  EXPECT_EQ(a.current_bytes(), 0u);
  auto small = floats(a, 1000, "small");
  EXPECT_EQ(a.current_bytes(), 4096u);      // rounded to 256 bytes
  EXPECT_EQ(a.reserved_bytes(), 2 * kMiB);  // from a small-pool segment
}

TEST(Allocator, AFreedBlockServesASmallerRequestAndKeepsTheRestFree) {
  HostAllocator a(1024 * kMiB);
  auto grad = floats(a, 10 * kMiB / 4, "grad");  // 10 MiB: a segment of its own
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(grad.tensor().data);
  EXPECT_EQ(a.reserved_bytes(), 10 * kMiB);
  grad.reset();
  auto copy = floats(a, 5 * kMiB / 4, "copy");  // half of it, from the same memory
  auto rest = floats(a, 5 * kMiB / 4, "rest");  // and the other half
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(copy.tensor().data), at);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(rest.tensor().data), at + 5 * kMiB);
  EXPECT_EQ(a.reserved_bytes(), 10 * kMiB);
  EXPECT_EQ(a.cached_bytes(), 0u);
}

TEST(Allocator, FreedNeighboursMergeIntoOneBlock) {
  HostAllocator a(1024 * kMiB);
  auto whole = floats(a, 12 * kMiB / 4, "whole");
  whole.reset();
  Allocation parts[3] = {floats(a, kMiB, "p0"), floats(a, kMiB, "p1"), floats(a, kMiB, "p2")};  // 4 MiB each
  parts[0].reset();
  parts[2].reset();
  parts[1].reset();  // merges with both sides
  auto again = floats(a, 12 * kMiB / 4, "again");
  EXPECT_EQ(a.reserved_bytes(), 12 * kMiB) << "a request of the whole segment needs no new one";
}

TEST(Allocator, ANarrowedAllocationHoldsAndGivesBackItsWholeBlock) {
  HostAllocator a(1024 * kMiB);
  a.record_events(true);
  auto g = a.allocate({2, 1000}, DType::f32, {MemKind::gradient, "w", -1});
  const Tensor whole = g.tensor();
  g.narrow(whole.rows(1, 1).view({10, 100}));  // the second of two parts, as rank 1's gradient
  EXPECT_EQ(g.tensor().data, static_cast<char*>(whole.data) + 4000);
  EXPECT_EQ(g.tensor().shape, (Shape{10, 100}));
  EXPECT_EQ(g.block().data, whole.data);
  EXPECT_EQ(g.block().numel(), 2000);
  EXPECT_EQ(a.current_bytes(MemKind::gradient), 8192u);  // the whole block, rounded to 256 bytes
  g.reset();
  EXPECT_EQ(a.current_bytes(), 0u);
  const MemEvent& freed = a.events().back();
  EXPECT_EQ(freed.action, MemAction::free);
  EXPECT_EQ(freed.address, reinterpret_cast<std::uintptr_t>(whole.data));  // the block's, not the part's
  EXPECT_EQ(freed.bytes, 8192u);
  auto h = a.allocate({100}, DType::f32, {MemKind::gradient, "h", -1});
  EXPECT_THROW(h.narrow(whole), std::logic_error) << "a part outside the block";
}

TEST(Allocator, TheSmallestBlockThatHoldsTheRequestWins) {
  HostAllocator a(1024 * kMiB);
  auto big = floats(a, 8 * kMiB / 4, "big"), gap = floats(a, 2 * kMiB / 4, "gap");
  auto mid = floats(a, 4 * kMiB / 4, "mid");
  const auto mid_at = reinterpret_cast<std::uintptr_t>(mid.tensor().data);
  big.reset();
  mid.reset();
  auto want = floats(a, 3 * kMiB / 4, "want");
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(want.tensor().data), mid_at);
}

TEST(Allocator, SmallRequestsDoNotCutLargeBlocks) {
  HostAllocator a(1024 * kMiB);
  auto big = floats(a, 8 * kMiB / 4, "big");
  big.reset();
  auto small = floats(a, 64, "small");
  EXPECT_EQ(a.reserved_bytes(), 10 * kMiB) << "the small request made a small-pool segment";
  auto big_again = floats(a, 8 * kMiB / 4, "big again");
  EXPECT_EQ(a.reserved_bytes(), 10 * kMiB);
}

TEST(Allocator, GivesBackOnlyWhollyFreeSegments) {
  HostAllocator a(1024 * kMiB);
  auto x = floats(a, 4 * kMiB / 4, "x");
  auto y = floats(a, 2 * kMiB / 4, "y");
  x.reset();
  a.release_cache();
  EXPECT_EQ(a.reserved_bytes(), 2 * kMiB);
  auto half = floats(a, 2 * kMiB / 4, "half");  // y's segment is full: a new one
  y.reset();
  a.release_cache();
  EXPECT_EQ(a.reserved_bytes(), 2 * kMiB);
}

// The state hash names what the next requests' addresses depend on (device graphs replay on it):
// the same blocks cut the same way hash the same whatever led there; any other cut does not.
TEST(Allocator, TheStateHashFollowsTheBlocksAndTheirCuts) {
  HostAllocator a(1024 * kMiB);
  auto x = floats(a, 3 * kMiB / 4, "x");
  auto y = floats(a, 5 * kMiB / 4, "y");
  const std::uint64_t both = a.state_hash();
  EXPECT_EQ(a.state_hash(), both);  // reading it changes nothing
  y.reset();
  const std::uint64_t x_alone = a.state_hash();
  EXPECT_NE(x_alone, both);
  y = floats(a, 5 * kMiB / 4, "y again");  // the same request lands where y was...
  EXPECT_EQ(a.state_hash(), both);         // ...so the state is the one before
  y.reset();
  auto z = floats(a, 4 * kMiB / 4, "z");  // a smaller one cuts the free block elsewhere
  EXPECT_NE(a.state_hash(), both);
  EXPECT_NE(a.state_hash(), x_alone);
  z.reset();
  EXPECT_EQ(a.state_hash(), x_alone);    // freed blocks merge back into the same cut
  auto small = floats(a, 100, "small");  // a new small-pool segment is part of the state too
  small.reset();
  EXPECT_NE(a.state_hash(), x_alone);
}

Allocation gradient(Allocator& a, std::int64_t n, const char* what) {
  return a.allocate({n}, DType::f32, {MemKind::gradient, what, -1});
}

std::uintptr_t address(const Allocation& x) { return reinterpret_cast<std::uintptr_t>(x.tensor().data); }

// Data parallelism's gradients in one region (NCCL's symmetric window on GPUs): requests of its kind
// go there first, small or large, at offsets that depend only on the requests; others never do.
// cuBLASLt's workspace is made this way at the first GEMM: in a segment of its own, it serves nothing
// else, neither takes from nor leaves a block in the pools, does not change how large the later
// segments grow, and goes back as soon as it is freed; the record holds it as any buffer.
TEST(Allocator, ABufferApartHasASegmentOfItsOwnOutsideThePools) {
  std::vector<std::size_t> grown;  // the reserved bytes after each large request, without and with it
  for (int apart = 0; apart < 2; ++apart) {
    HostAllocator a(4096 * kMiB);
    a.record_events(true);
    auto first = floats(a, 800 * kMiB / 4, "first");
    Allocation ws;
    if (apart) {
      ws = a.allocate_apart({(32 * kMiB + 100) / 4}, DType::f32, {MemKind::workspace, "workspace", -1});
      EXPECT_EQ(a.reserved_bytes(), 800 * kMiB + 34 * kMiB);  // rounded to the segment unit (2 MiB)
      EXPECT_EQ(a.current_bytes(MemKind::workspace), Allocator::rounded_bytes(32 * kMiB + 100));
      const MemEvent& made = a.events()[a.events().size() - 2];
      EXPECT_EQ(made.action, MemAction::segment_alloc);
      EXPECT_EQ(made.bytes, 34 * kMiB);
      EXPECT_EQ(a.events().back().action, MemAction::alloc);
      EXPECT_EQ(a.events().back().tag.what, std::string("workspace"));
    }
    auto small = floats(a, 100, "small");  // from a small segment, not the rest of the workspace's
    EXPECT_TRUE(address(small) < address(ws) || address(small) >= address(ws) + 34 * kMiB || !apart);
    // Grown to an eighth of what the pools hold (100 MiB), as without the workspace.
    auto second = floats(a, 20 * kMiB / 4, "second");
    grown.push_back(a.reserved_bytes() - (apart ? 34 * kMiB : 0));
    if (apart) {
      const std::size_t held = a.reserved_bytes();
      ws.reset();  // back at once, not cached
      EXPECT_EQ(a.reserved_bytes(), held - 34 * kMiB);
      EXPECT_EQ(a.events().back().action, MemAction::segment_free);
    }
  }
  EXPECT_EQ(grown[0], grown[1]);
}

TEST(Allocator, ARegionServesItsKindAtOffsetsTheRequestsDecide) {
  std::vector<std::vector<std::uintptr_t>> offsets;
  for (int run = 0; run < 2; ++run) {
    HostAllocator a(1024 * kMiB);
    auto before = floats(a, run == 0 ? 1000 : 3 * kMiB, "before");  // the pools differ between the runs
    a.open_region(MemKind::gradient, 6 * kMiB, {MemKind::gradient, "region", -1});
    EXPECT_TRUE(a.region_open());
    const std::size_t reserved = a.reserved_bytes();
    auto act = floats(a, 100, "activation");  // not the region's kind: a pool's
    auto g0 = gradient(a, 100, "g0"), g1 = gradient(a, kMiB, "g1"), g2 = gradient(a, 5000, "g2");
    const std::uintptr_t base = address(g0);
    offsets.push_back({address(g1) - base, address(g2) - base});
    EXPECT_TRUE(address(act) < base || address(act) >= base + 6 * kMiB);
    g1.reset();  // freed space in the region serves the next gradient that fits
    auto g3 = gradient(a, kMiB / 2, "g3");
    EXPECT_EQ(address(g3) - base, offsets.back()[0]);
    auto g4 = gradient(a, 2 * kMiB, "g4");  // more than the region has left: a pool's
    EXPECT_TRUE(address(g4) < base || address(g4) >= base + 6 * kMiB);
    EXPECT_GT(a.reserved_bytes(), reserved);
  }
  EXPECT_EQ(offsets[0], offsets[1]);
}

TEST(Allocator, AClosedRegionServesNothingAndGoesBackOnceEmpty) {
  HostAllocator a(1024 * kMiB);
  int freed = 0;
  RegionMemory memory{[](std::size_t bytes) { return std::aligned_alloc(256, bytes); },
                      [&](void* p, std::size_t) {
                        ++freed;
                        std::free(p);
                      }};
  a.open_region(MemKind::gradient, 3 * kMiB, {MemKind::gradient, "region", -1}, memory);
  EXPECT_EQ(a.reserved_bytes(), 4 * kMiB);  // whole segment units
  auto g = gradient(a, kMiB, "g");
  a.release_cache();
  EXPECT_EQ(a.reserved_bytes(), 4 * kMiB) << "an open region is never given back";
  a.close_region();
  EXPECT_FALSE(a.region_open());
  EXPECT_EQ(freed, 0) << "not while a gradient is in it";
  auto later = gradient(a, kMiB, "later");
  EXPECT_TRUE(address(later) < address(g) || address(later) >= address(g) + 4 * kMiB);
  g.reset();
  a.release_cache();
  EXPECT_EQ(freed, 1) << "through the region's own free";
  a.open_region(MemKind::gradient, 2 * kMiB, {MemKind::gradient, "next", -1});
  EXPECT_THROW(a.open_region(MemKind::gradient, 2 * kMiB, {MemKind::gradient, "twice", -1}), std::exception);
}

TEST(Allocator, ClosingAnEmptyRegionGivesBackItAloneAndChangesTheStateHash) {
  HostAllocator a(1024 * kMiB);
  floats(a, 3 * kMiB / 4, "cached").reset();  // a free segment in the cache
  int freed = 0;
  RegionMemory memory{[](std::size_t bytes) { return std::aligned_alloc(256, bytes); },
                      [&](void* p, std::size_t) {
                        ++freed;
                        std::free(p);
                      }};
  const std::uint64_t before = a.state_hash();
  a.open_region(MemKind::gradient, 2 * kMiB, {MemKind::gradient, "region", -1}, memory);
  const std::uint64_t open = a.state_hash();
  EXPECT_NE(open, before);
  a.close_region();
  EXPECT_EQ(freed, 1);
  EXPECT_EQ(a.reserved_bytes(), 4 * kMiB) << "the cached segment stays";
  EXPECT_EQ(a.state_hash(), before);
}

TEST(Allocator, ARecordReplaysToTheAllocatorsNumbers) {
  HostAllocator a(1024 * kMiB);
  a.record_events(true);
  std::vector<Allocation> held;
  a.open_region(MemKind::gradient, 2 * kMiB, {MemKind::gradient, "region", -1});  // a segment like the others
  for (int i = 0; i < 40; ++i) {
    held.push_back(i % 4 == 0 ? gradient(a, (i % 5 + 1) * 20000, "g")
                              : floats(a, (i % 7 + 1) * 100000 + (i % 3) * 64, "x"));
    if (i % 3 == 2) held.erase(held.begin() + i % 5 % static_cast<int>(held.size()));
  }
  MemoryReplay replay;
  for (const MemEvent& e : a.events()) replay.apply(e);
  EXPECT_EQ(replay.allocated(), a.current_bytes());
  EXPECT_EQ(replay.reserved(), a.reserved_bytes());
  std::size_t in_segments = 0;
  for (const MemoryReplay::Segment& s : replay.segments())
    for (const auto& [address, b] : s.live) {
      EXPECT_GE(address, s.address);
      EXPECT_LE(address + b.bytes, s.address + s.bytes);
      in_segments += b.bytes;
    }
  EXPECT_EQ(in_segments, a.current_bytes());
}

}  // namespace
}  // namespace lmscope::test
