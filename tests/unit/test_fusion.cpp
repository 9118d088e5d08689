// The fused ops change launches, not results: on the CPU a whole training step with --fusion on (the
// residual adds made with the norms after them, forward and backward; AdamW's step as one op) gives
// the unfused step's loss, gradients and updated parameters bit for bit, with each recompute mode and
// with micro-batches, over two steps (the second reads what the first one's AdamW wrote).
#include "../common/one_step.h"

#include "lmscope/backend/backend.h"
#include "lmscope/backend/meta/meta_backend.h"

#include <gtest/gtest.h>

#include <cstring>

namespace lmscope::test {
namespace {

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

TEST(Fusion, GivesTheUnfusedStepBitForBit) {
  auto be = make_backend("cpu", "fp32");
  OneStepSpec spec;
  spec.model = tiny_model();
  spec.ctx = 24;
  spec.steps = 2;
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
    for (std::int64_t micro : {4, 2}) {
      SCOPED_TRACE(std::string(recompute_name(r)) + ", micro-batches of " + std::to_string(micro));
      spec.recompute = r;
      spec.micro = micro;
      spec.fusion = false;
      const OneStep unfused = one_step(*be, spec);
      spec.fusion = true;
      const OneStep fused = one_step(*be, spec);
      EXPECT_EQ(std::memcmp(&fused.loss, &unfused.loss, sizeof(double)), 0);
      EXPECT_TRUE(same_bits(fused.grads, unfused.grads));
      EXPECT_TRUE(same_bits(fused.params, unfused.params));
      EXPECT_FALSE(unfused.params.empty());
    }
}

// The fused AdamW step's order, as the dry run standing for CUDA takes it (the CUDA backend takes the
// same steps): groups of at most 24, each copy asked for before its gradient is said read, every
// gradient read in order, and no more copies made than gradients read, one copy aside. Without
// copies, or with copies that exist already (resident, refreshed in place), the groups are 24 wide.
TEST(Fusion, TheFusedStepMakesCopiesOnlyWhereGradientsWent) {
  auto be = make_meta_backend(dry_run_target("cuda"), "bf16");
  Allocator& mem = be->allocator();
  std::vector<Allocation> owned;
  std::vector<Tensor> params, grads, m, v;
  for (int i = 0; i < 60; ++i) {
    const Shape s{1 + (i * 7919) % 50000};
    for (auto* list : {&params, &grads, &m, &v}) {
      owned.push_back(mem.allocate(s, DType::f32, {}));
      list->push_back(owned.back());
    }
  }
  Allocation norm = mem.allocate({4}, DType::f32, {});
  enum class Copies { made, held, none };
  for (Copies mode : {Copies::made, Copies::held, Copies::none}) {
    const bool with_copies = mode == Copies::made;
    SCOPED_TRACE(mode == Copies::made ? "copies made" : mode == Copies::held ? "copies held" : "no copies");
    std::vector<Allocation> copies(params.size());
    if (mode == Copies::held)
      for (std::size_t i = 0; i < params.size(); ++i) copies[i] = mem.allocate(params[i].shape, DType::bf16, {});
    std::vector<std::size_t> asked, read, group_sizes{0};
    std::size_t made = 0, gone = 0, worst = 0;
    be->adamw_all(
        params, grads, m, v, AdamWArgs{}, norm,
        [&](std::size_t i) {
          if (!read.empty() && read.back() + 1 == i) group_sizes.push_back(0);  // a new group begins
          asked.push_back(i);
          ++group_sizes.back();
          if (with_copies) {
            copies[i] = mem.allocate(params[i].shape, DType::bf16, {});
            made += copies[i].tensor().bytes();
            worst = std::max(worst, made - std::min(made, gone + copies[i].tensor().bytes()));
          }
          return copies[i].tensor();
        },
        [&](std::size_t i) {
          EXPECT_EQ(std::count(asked.begin(), asked.end(), i), 1) << i;
          read.push_back(i);
          gone += grads[i].bytes();
        });
    ASSERT_EQ(asked.size(), params.size());
    ASSERT_EQ(read.size(), params.size());
    for (std::size_t i = 0; i < params.size(); ++i) EXPECT_EQ(read[i], i);
    EXPECT_EQ(worst, 0u) << "copies beyond the gradients read, one copy aside";
    for (std::size_t size : group_sizes) EXPECT_LE(size, 24u);
    if (with_copies)
      EXPECT_GT(group_sizes.size(), 3u) << "the first groups are narrow: few gradients have gone";
    else
      EXPECT_EQ(group_sizes, (std::vector<std::size_t>{24, 24, 12}));
  }
}

}  // namespace
}  // namespace lmscope::test
