// The fused ops change launches, not results: on the CPU a whole training step with --fusion on (the
// residual adds made with the norms after them, forward and backward; AdamW's step as one op) gives
// the unfused step's loss, gradients and updated parameters bit for bit, with each recompute mode and
// with micro-batches, over two steps (the second reads what the first one's AdamW wrote).
#include "../common/one_step.h"

#include "lmscope/backend/backend.h"

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
  spec.model.name = "tiny";
  spec.model.vocab = 37;
  spec.model.d_model = 32;
  spec.model.d_ff = 48;
  spec.model.layers = 3;
  spec.model.heads = 2;
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

}  // namespace
}  // namespace lmscope::test
