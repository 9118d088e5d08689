// The memory diet on the GPU: recomputation, gradient accumulation, transient and resident weight
// copies give the results of the plain step, and the same step twice gives the same bits: no kernel
// of a step sums in an order that varies (the embedding's and RMSNorms' weight gradients and the global norm
// reduce in a fixed order), which is what lets a resumed run equal the run never stopped.
// Recomputation and accumulation sum in other orders than the plain step, so their bounds are
// fp32's and bf16's. Skipped without a GPU.
#include "../common/one_step.h"

#include "lmscope/backend/backend.h"
#include "lmscope/backend/devices.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

namespace lmscope::test {
namespace {

OneStepSpec gpu_step(std::optional<DType> compute) {
  OneStepSpec s;
  s.model = gpu_model();
  s.compute = compute;
  s.rows = s.micro = 4;
  s.ctx = 64;
  return s;
}

TEST(MemoryDietOnGpu, TheSameStepsTwiceGiveTheSameBits) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  for (const char* precision : {"fp32", "bf16"}) {
    auto be = make_backend("cuda", precision);
    OneStepSpec spec = gpu_step(std::string(precision) == "bf16" ? std::optional(DType::bf16) : std::nullopt);
    spec.steps = 3;
    const OneStep a = one_step(*be, spec), b = one_step(*be, spec);
    EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << precision;
    for (std::size_t i = 0; i < a.grads.size(); ++i) {
      EXPECT_EQ(std::memcmp(a.grads[i].data(), b.grads[i].data(), a.grads[i].size() * sizeof(float)), 0)
          << precision << ": gradient " << i;
      EXPECT_EQ(std::memcmp(a.params[i].data(), b.params[i].data(), a.params[i].size() * sizeof(float)), 0)
          << precision << ": parameter " << i;
    }
  }
}

TEST(MemoryDietOnGpu, RecomputationGivesThePlainStepsGradients) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  for (const char* precision : {"fp32", "bf16"}) {
    auto be = make_backend("cuda", precision);
    const std::optional<DType> compute = std::string(precision) == "bf16" ? std::optional(DType::bf16) : std::nullopt;
    const OneStep none = one_step(*be, gpu_step(compute)), again = one_step(*be, gpu_step(compute));
    const double noise = largest_relative_difference(again.grads, none.grads);
    for (const RecomputePlan& r : {RecomputePlan(Recompute::selective), RecomputePlan(Recompute::full),
                                   RecomputePlan(Recompute::full, 1, Recompute::selective)}) {
      OneStepSpec spec = gpu_step(compute);
      spec.recompute = r;
      const OneStep other = one_step(*be, spec);
      const double diff = largest_relative_difference(other.grads, none.grads);
      std::printf("%s %s: gradients within %.3g of none (the same step twice: %.3g)\n", precision,
                  recompute_name(r).c_str(), diff, noise);
      EXPECT_LT(diff, std::string(precision) == "bf16" ? 1e-2 : 1e-5) << precision << " " << recompute_name(r);
      EXPECT_NEAR(other.loss, none.loss, 1e-6 * none.loss) << precision << " " << recompute_name(r);
      EXPECT_LT(other.saved_bytes, none.saved_bytes);
    }
  }
}

// Two steps (the second reads what the first's AdamW wrote) with the copies placed as `copies` end
// within the run-to-run noise of steps with kept ones.
void expect_steps_as_with_kept_copies(WeightCopies copies) {
  auto be = make_backend("cuda", "bf16");
  OneStepSpec spec = gpu_step(DType::bf16);
  spec.steps = 2;
  spec.micro = 2;  // and with micro-batches, where kept copies live across the step's backwards
  const OneStep kept = one_step(*be, spec), again = one_step(*be, spec);
  spec.weight_copies = copies;
  const OneStep other = one_step(*be, spec);
  const double noise = largest_relative_difference(again.params, kept.params),
               diff = largest_relative_difference(other.params, kept.params);
  std::printf("%s copies: loss %.9g against %.9g, parameters within %.3g (the same steps twice: %.3g)\n",
              weight_copies_name(copies), other.loss, kept.loss, diff, noise);
  EXPECT_NEAR(other.loss, kept.loss, 1e-6 * kept.loss);
  EXPECT_LT(diff, 10 * noise + 1e-7);
}

// Copies cast where they are used are the copies AdamW writes when they are kept.
TEST(MemoryDietOnGpu, TransientWeightCopiesStepAsKeptOnes) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  expect_steps_as_with_kept_copies(WeightCopies::transient);
}

// Copies AdamW refreshes in place are the copies it writes anew when they are kept.
TEST(MemoryDietOnGpu, ResidentWeightCopiesStepAsKeptOnes) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  expect_steps_as_with_kept_copies(WeightCopies::resident);
}

TEST(MemoryDietOnGpu, AccumulatedMicroBatchesStepAsOneBatch) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  auto be = make_backend("cuda", "fp32");
  OneStepSpec spec = gpu_step(std::nullopt);
  spec.rows = spec.micro = 8;
  const OneStep whole = one_step(*be, spec);
  for (std::int64_t micro : {4, 2}) {
    spec.micro = micro;
    const OneStep parts = one_step(*be, spec);
    const double grads = largest_relative_difference(parts.grads, whole.grads),
                 params = largest_relative_difference(parts.params, whole.params);
    std::printf("%lld micro-batches: loss %.9g against %.9g, gradients within %.3g, parameters %.3g\n",
                static_cast<long long>(8 / micro), parts.loss, whole.loss, grads, params);
    EXPECT_NEAR(parts.loss, whole.loss, 1e-6 * whole.loss);
    EXPECT_LT(grads, 1e-5);
    EXPECT_LT(params, 1e-6);
  }
}

}  // namespace
}  // namespace lmscope::test
