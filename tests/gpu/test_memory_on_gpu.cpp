// The memory record on the GPU: the dry run standing for this GPU records what the CUDA backend
// records, event for event, over the presets × ctx 128..4096 × fp32/bf16 × naive/flash train steps
// that fit; the allocator plus the device's own overhead is what the driver reports; and the
// stored H100 facts the dry run uses without a GPU are this H100's. Skipped without a GPU.
#include "lmscope/backend/devices.h"
#include "lmscope/device/device_facts.h"
#include "lmscope/memory/memory_analysis.h"
#include "lmscope/model/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>

namespace lmscope::test {
namespace {

void print_facts(const FlashKernelFacts& f) {
  std::printf("live facts: {%d, %s, {\n", f.sms, f.hopper ? "true" : "false");
  for (const FlashResidency& r : f.residency)
    std::printf("    {%d, %d, %d, %d, %d, %d, %d, %d, %d},\n", r.d, r.forward_tc, r.dkdv_tc, r.dkdv_tc_atomic, r.dq_tc,
                r.forward_wgmma, r.backward_wgmma, r.backward_wgmma_atomic, r.dq_wgmma);
  std::printf("}}\n");
}

// A bf16/fp32 train cell on the GPU, batch 4, one warm-up step.
BenchSpec train_cell(const ModelConfig& model, const std::string& precision, AttentionKind attention,
                     std::int64_t ctx) {
  BenchSpec s;
  s.model = model;
  s.device = "cuda";
  s.precision = precision;
  s.attention = attention;
  s.mode = StepMode::train;
  s.batch = 4;
  s.ctx = ctx;
  s.warmup = 1;
  s.steps = 1;
  return s;
}

bool same(const FlashResidency& a, const FlashResidency& b) {
  return a.d == b.d && a.forward_tc == b.forward_tc && a.dkdv_tc == b.dkdv_tc && a.dkdv_tc_atomic == b.dkdv_tc_atomic &&
         a.dq_tc == b.dq_tc && a.forward_wgmma == b.forward_wgmma && a.backward_wgmma == b.backward_wgmma &&
         a.backward_wgmma_atomic == b.backward_wgmma_atomic && a.dq_wgmma == b.dq_wgmma;
}

TEST(MemoryOnGpu, StoredH100FactsAreThisH100s) {
  const auto gpus = list_gpus();
  if (gpus.empty()) GTEST_SKIP() << "no CUDA GPU visible";
  if (gpus[0].name.find("H100 80GB HBM3") == std::string::npos) GTEST_SKIP() << "not an H100 80GB HBM3";
  const FlashKernelFacts live = visible_gpu_flash_facts(), stored = h100_flash_facts();
  print_facts(live);
  std::printf("live memory: %zu bytes\n", gpus[0].memory_bytes);
  EXPECT_EQ(gpus[0].memory_bytes, h100_memory_bytes());
  EXPECT_EQ(live.sms, stored.sms);
  EXPECT_EQ(live.hopper, stored.hopper);
  ASSERT_EQ(live.residency.size(), stored.residency.size());
  for (std::size_t i = 0; i < live.residency.size(); ++i)
    EXPECT_TRUE(same(live.residency[i], stored.residency[i])) << "head dim " << live.residency[i].d;
}

// Everything but the addresses and times, which the dry run makes up; the addresses must map one
// to one (the same segment reused where the GPU reuses it).
void expect_same_record(const MemoryRecord& gpu, const MemoryRecord& dry, const std::string& cell) {
  ASSERT_EQ(gpu.events.size(), dry.events.size()) << cell;
  ASSERT_EQ(gpu.step_begin, dry.step_begin) << cell;
  std::map<std::uintptr_t, std::uintptr_t> to_dry, to_gpu;
  for (std::size_t i = 0; i < gpu.events.size(); ++i) {
    const MemEvent &g = gpu.events[i], &d = dry.events[i];
    ASSERT_TRUE(g.action == d.action && g.bytes == d.bytes && g.tag == d.tag && g.shape == d.shape &&
                g.dtype == d.dtype && g.phase == d.phase)
        << cell << ": event " << i << " " << mem_action_name(g.action) << " " << g.tag.what << " " << g.bytes
        << " against " << mem_action_name(d.action) << " " << d.tag.what << " " << d.bytes;
    if (g.action == MemAction::oom) continue;
    auto [a, fresh_a] = to_dry.emplace(g.address, d.address);
    auto [b, fresh_b] = to_gpu.emplace(d.address, g.address);
    ASSERT_TRUE(a->second == d.address && b->second == g.address) << cell << ": event " << i << " at another block";
  }
}

TEST(MemoryOnGpu, DryRunRecordsWhatTheGpuRecordsAndTheDriverAgrees) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  int compared = 0, out_of_memory = 0;
  for (const char* model : {"small", "medium", "large", "xl", "2.7B"})
    for (std::int64_t ctx : {128, 256, 512, 1024, 2048, 4096})
      for (const char* precision : {"fp32", "bf16"})
        for (AttentionKind attention : {AttentionKind::naive, AttentionKind::flash}) {
          MemorySpec spec;
          spec.cell = train_cell(preset(model), precision, attention, ctx);
          const std::string cell = fmt::format("{} ctx {} {} {}", model, ctx, precision, attention_name(attention));
          const MemoryRecord gpu = record_memory(spec);
          if (gpu.outcome == MemoryOutcome::out_of_memory) {  // the dry run must say it does not fit either
            MemorySpec dry_spec = spec;
            dry_spec.dry_run = true;
            EXPECT_FALSE(record_memory(dry_spec).fits()) << cell << " ran out of memory on the GPU only";
            ++out_of_memory;
            continue;
          }
          ASSERT_TRUE(gpu.ok()) << cell << ": " << gpu.status;
          MemorySpec dry_spec = spec;
          dry_spec.dry_run = true;
          const MemoryRecord dry = record_memory(dry_spec);
          ASSERT_TRUE(dry.ok()) << cell << ": " << dry.status;
          expect_same_record(gpu, dry, cell);
          const MemoryAnalysis g = analyze_memory(gpu, 1), d = analyze_memory(dry, 1);
          EXPECT_EQ(g.peak, d.peak) << cell;
          for (int p = 0; p < kPhases; ++p) EXPECT_EQ(g.phase_peak[p], d.phase_peak[p]) << cell;
          // The driver's count against the allocator's segments in 2 MiB pages plus what was in use before.
          ASSERT_TRUE(gpu.device.has_value());
          const double expected = static_cast<double>(gpu.device->used_at_start + g.paged_at_step_end);
          const double reported = static_cast<double>(gpu.device->used);
          EXPECT_NEAR(reported / expected, 1.0, 0.02) << cell << ": driver " << reported << " against " << expected;
          std::printf("%s: peak %zu, driver %.0f MiB, expected %.0f MiB, own %zu\n", cell.c_str(), g.peak,
                      reported / 1048576, expected / 1048576, gpu.device->used_at_start);
          ++compared;
        }
  std::printf("compared %d cells; %d out of memory on both\n", compared, out_of_memory);
  EXPECT_GT(compared, 50);
}

// Recomputation (by mode and per layer), gradient accumulation and transient weight copies allocate
// differently; the dry run follows each.
TEST(MemoryOnGpu, DryRunRecordsEveryRecomputeAccumulationAndCopiesMode) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  int compared = 0;
  struct Cell {
    const char* model;
    std::int64_t ctx;
    const char* precision;
    AttentionKind attention;
    RecomputePlan recompute;
    int grad_accum;
    WeightCopies weight_copies = WeightCopies::kept;
  };
  std::vector<Cell> cells;
  for (const char* model : {"small", "large", "2.7B"})
    for (Recompute r : {Recompute::selective, Recompute::full})
      for (std::int64_t ctx : {512, 4096}) cells.push_back({model, ctx, "bf16", AttentionKind::flash, r, 1});
  cells.push_back({"medium", 1024, "fp32", AttentionKind::naive, Recompute::selective, 1});
  cells.push_back({"medium", 1024, "fp32", AttentionKind::naive, Recompute::full, 2});
  cells.push_back({"xl", 1024, "bf16", AttentionKind::flash, Recompute::none, 3});
  for (const char* model : {"medium", "2.7B"})
    for (Recompute r : {Recompute::none, Recompute::full})
      cells.push_back({model, 1024, "bf16", AttentionKind::flash, r, 1, WeightCopies::transient});
  cells.push_back({"xl", 4096, "bf16", AttentionKind::flash, Recompute::none, 1, WeightCopies::transient});
  cells.push_back({"large", 2048, "bf16", AttentionKind::naive, Recompute::selective, 2, WeightCopies::transient});
  cells.push_back({"medium", 512, "bf16", AttentionKind::flash, Recompute::none, 2, WeightCopies::resident});
  // Modes per layer: the first layers in full and the rest selective, or the rest as they are.
  cells.push_back(
      {"2.7B", 4096, "bf16", AttentionKind::flash, RecomputePlan(Recompute::full, 12, Recompute::selective), 1});
  cells.push_back({"large", 2048, "bf16", AttentionKind::flash, RecomputePlan(Recompute::full, 20, Recompute::none), 2,
                   WeightCopies::transient});
  for (const Cell& c : cells) {
    MemorySpec spec;
    spec.cell = train_cell(preset(c.model), c.precision, c.attention, c.ctx);
    spec.cell.recompute = c.recompute;
    spec.cell.grad_accum = c.grad_accum;
    spec.cell.weight_copies = c.weight_copies;
    const std::string cell = fmt::format("{} ctx {} {} {} {} recompute, {} micro-batches, {} copies", c.model, c.ctx,
                                         c.precision, attention_name(c.attention), recompute_name(c.recompute),
                                         c.grad_accum, weight_copies_name(c.weight_copies));
    const MemoryRecord gpu = record_memory(spec);
    MemorySpec dry_spec = spec;
    dry_spec.dry_run = true;
    const MemoryRecord dry = record_memory(dry_spec);
    if (gpu.outcome == MemoryOutcome::out_of_memory) {
      EXPECT_FALSE(dry.fits()) << cell << " ran out of memory on the GPU only";
      continue;
    }
    ASSERT_TRUE(gpu.ok()) << cell << ": " << gpu.status;
    ASSERT_TRUE(dry.ok()) << cell << ": " << dry.status;
    expect_same_record(gpu, dry, cell);
    const MemoryAnalysis g = analyze_memory(gpu, 1);
    std::printf("%s: peak %zu, equal\n", cell.c_str(), g.peak);
    ++compared;
  }
  EXPECT_GT(compared, 15);
}

}  // namespace
}  // namespace lmscope::test
