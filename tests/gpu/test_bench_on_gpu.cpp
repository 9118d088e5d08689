// bench cells on the GPU: what an fp16 cell says of its loss scaler, and a profiled cell's kernels
// in their phases (fused and unfused). Every test skips where no GPU is visible.
#include "../common/small_cuda_cell.h"

#include "lmscope/backend/cuda/kernels.h"
#include "lmscope/backend/devices.h"
#include "lmscope/bench/runner.h"

#include <gtest/gtest.h>

#include <utility>

namespace lmscope::test {
namespace {

// fp16 train cells carry the loss scaler's count of skipped measured steps and its scale; others none.
TEST(CudaBench, Fp16CellsReportTheLossScaler) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  for (const char* precision : {"fp16", "bf16"}) {
    const BenchSpec spec = small_cuda_cell(precision, 1, 3);
    const BenchResult r = run_bench_cell(spec);
    ASSERT_TRUE(r.ok()) << r.status;
    if (spec.precision == "fp16") {
      ASSERT_TRUE(r.skipped_steps.has_value());
      EXPECT_EQ(*r.skipped_steps, 0);  // the default scale, 2^16, fits this model's gradients
      EXPECT_EQ(r.loss_scale, 65536.0);
    } else {
      EXPECT_FALSE(r.skipped_steps.has_value());
    }
  }
}

TEST(CudaProfile, BenchCellAccountsForEveryPhase) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  for (bool fusion : {false, true}) {
    SCOPED_TRACE(fusion ? "fused" : "unfused");
    BenchSpec spec = small_cuda_cell("bf16", 1, 3);
    spec.profile = true;
    spec.fusion = fusion;
    const BenchResult r = run_bench_cell(spec);
    ASSERT_TRUE(r.ok()) << r.status;
    const KernelProfile& k = r.kernels;
    ASSERT_EQ(k.steps, 3);
    for (auto [p, stats] : {std::pair{Phase::forward, r.forward}, std::pair{Phase::backward, r.backward},
                            std::pair{Phase::optimizer, r.optimizer}}) {
      EXPECT_GT(k.busy_ms(p), 0) << phase_name(p);
      EXPECT_LE(k.busy_ms(p), stats.mean * 1.001) << phase_name(p) << ": kernels cannot outlast their phase";
    }
    // AdamW: a launch per parameter tensor per step, or fused, one per 24 of them; GEMMs in forward and
    // backward.
    const int params = 3 + 9 * static_cast<int>(spec.model.layers);  // embedding, 9 per layer, norm, head
    const char* adamw_name = fusion ? "adamw_many_kernel" : "adamw_kernel";
    const int launches = fusion ? (params + cuda::kTensorsPerLaunch - 1) / cuda::kTensorsPerLaunch : params;
    bool adamw = false, fwd_gemm = false, bwd_gemm = false;
    for (const KernelSummary& s : k.kernels) {
      if (s.name.starts_with(adamw_name)) {
        adamw = true;
        EXPECT_DOUBLE_EQ(s.calls_per_step, launches);
        EXPECT_EQ(s.phase, Phase::optimizer);
      }
      fwd_gemm |= s.category == "GEMM" && s.phase == Phase::forward;
      bwd_gemm |= s.category == "GEMM" && s.phase == Phase::backward;
    }
    EXPECT_TRUE(adamw && fwd_gemm && bwd_gemm);
  }
}

}  // namespace
}  // namespace lmscope::test
