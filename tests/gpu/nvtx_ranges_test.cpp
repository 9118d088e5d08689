// NVTX ranges as a profiler hears them. A tool reaches NVTX by injection: NVTX loads the library
// NVTX_INJECTION64_PATH names at its first call, as nsys does with its own. Here that library is
// CUPTI, whose marker records then carry every range; so this runs in a process of its own that sets
// the variable before any NVTX call. One bench step must show as nested ranges in the "lmscope"
// domain: the step, its phases, each layer and each op. Skips where no GPU is visible.
#include "../common/small_cuda_cell.h"

#include "lmscope/backend/devices.h"
#include "lmscope/bench/runner.h"

#include <cupti.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace lmscope {
namespace {

struct Marker {
  std::string name, domain;
  std::uint64_t start = 0, end = 0;
};
std::map<std::uint32_t, Marker> markers;  // by CUPTI's range id

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *size = std::size_t{4} << 20;
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_MARKER) continue;
    const auto* m = reinterpret_cast<const CUpti_ActivityMarker2*>(rec);
    Marker& k = markers[m->id];
    if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_START) {
      k.name = m->name ? m->name : "";
      k.domain = m->domain ? m->domain : "";
      k.start = m->timestamp;
    }
    if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_END) k.end = m->timestamp;
  }
  std::free(buffer);
}

TEST(NvtxRanges, AProfilerSeesStepsPhasesLayersAndOps) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  ASSERT_EQ(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), CUPTI_SUCCESS);
  ASSERT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MARKER), CUPTI_SUCCESS);
  const BenchResult r = run_bench_cell(test::small_cuda_cell("bf16", 0, 1));
  ASSERT_TRUE(r.ok()) << r.status;
  ASSERT_EQ(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), CUPTI_SUCCESS);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MARKER);

  std::map<std::string, int> count;
  std::vector<const Marker*> ranges;
  for (const auto& [id, m] : markers) {
    EXPECT_EQ(m.domain, "lmscope") << m.name;
    EXPECT_LE(m.start, m.end) << m.name;
    ++count[m.name];
    ranges.push_back(&m);
  }
  EXPECT_EQ(count["step 0"], 1);
  EXPECT_EQ(count["forward"], 1);
  EXPECT_EQ(count["backward"], 1);
  EXPECT_EQ(count["optimizer"], 1);
  EXPECT_EQ(count["layer 0"], 2);  // in the forward and in the backward
  EXPECT_EQ(count["layer 1"], 2);
  EXPECT_EQ(count["attention"], 4);
  // Every range lies inside the step, and any two are nested or apart.
  const Marker* step = nullptr;
  for (const Marker* m : ranges)
    if (m->name == "step 0") step = m;
  ASSERT_TRUE(step);
  for (const Marker* a : ranges) {
    EXPECT_TRUE(a->start >= step->start && a->end <= step->end) << a->name;
    for (const Marker* b : ranges) {
      const bool apart = a->end <= b->start || b->end <= a->start;
      const bool nested = (a->start <= b->start && b->end <= a->end) || (b->start <= a->start && a->end <= b->end);
      EXPECT_TRUE(apart || nested) << a->name << " and " << b->name;
    }
  }
}

}  // namespace
}  // namespace lmscope

int main(int argc, char** argv) {
  // Before NVTX's first call anywhere in the process: NVTX reads it once.
  setenv("NVTX_INJECTION64_PATH", LMSCOPE_CUPTI_LIBRARY, 1);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
