// The memory diet's modes change memory, not results. Activation recomputation (--recompute): every
// mode gives the gradients of `none` bit for bit (fp32 on the CPU: the recomputation runs the
// forward's own ops on the same inputs) and keeps less for the backward. Gradient accumulation
// (--grad-accum): K micro-batches give the loss, gradients and AdamW step of one batch of them all.
// The logits in chunks: the loss, gradients and step of the logits whole, and none kept.
#include "../common/one_step.h"

#include "lmscope/backend/backend.h"

#include <gtest/gtest.h>

#include <cstring>

namespace lmscope::test {
namespace {

OneStepSpec small_step(AttentionKind attention) {
  OneStepSpec s;
  s.model = tiny_model();
  s.attention = attention;
  s.rows = s.micro = 2;
  s.ctx = 40;
  return s;
}

OneStep cpu_step(const OneStepSpec& s) {
  auto be = make_backend("cpu", "fp32");
  return one_step(*be, s);
}

class DietWith : public ::testing::TestWithParam<AttentionKind> {};
INSTANTIATE_TEST_SUITE_P(Attention, DietWith, ::testing::Values(AttentionKind::naive, AttentionKind::flash),
                         [](const auto& info) { return std::string(attention_name(info.param)); });

TEST_P(DietWith, EveryRecomputeModeGivesTheSameGradientsBitForBit) {
  const OneStep none = cpu_step(small_step(GetParam()));
  for (Recompute r : {Recompute::selective, Recompute::full}) {
    OneStepSpec spec = small_step(GetParam());
    spec.recompute = r;
    const OneStep other = cpu_step(spec);
    EXPECT_EQ(std::memcmp(&other.loss, &none.loss, sizeof(double)), 0) << recompute_name(r);
    ASSERT_EQ(other.grads.size(), none.grads.size());
    for (std::size_t i = 0; i < none.grads.size(); ++i)
      EXPECT_EQ(std::memcmp(other.grads[i].data(), none.grads[i].data(), none.grads[i].size() * sizeof(float)), 0)
          << recompute_name(r) << ": parameter " << i;
  }
}

TEST_P(DietWith, RecomputationKeepsLessForTheBackward) {
  std::size_t saved[3];
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
    OneStepSpec spec = small_step(GetParam());
    spec.recompute = r;
    saved[static_cast<int>(r)] = cpu_step(spec).saved_bytes;
  }
  EXPECT_LT(saved[1], saved[0]);
  EXPECT_LT(saved[2], saved[1]);
}

// Within 1e-6 relative (per tensor, in norm): the micro-batches sum their gradients in another
// order than one batch does.
TEST_P(DietWith, AccumulatedMicroBatchesStepAsOneBatch) {
  OneStepSpec spec = small_step(GetParam());
  spec.rows = spec.micro = 6;
  spec.ctx = 24;
  const OneStep whole = cpu_step(spec);
  for (std::int64_t micro : {3, 2, 1}) {
    spec.micro = micro;
    const OneStep parts = cpu_step(spec);
    EXPECT_NEAR(parts.loss, whole.loss, 1e-6 * std::fabs(whole.loss)) << micro;
    EXPECT_LT(largest_relative_difference(parts.grads, whole.grads), 1e-6) << micro;
    EXPECT_LT(largest_relative_difference(parts.params, whole.params), 1e-6) << micro;
  }
}

// Chunks of 3 rows (80 rows: 27 chunks, the last short; 40 in each of two micro-batches), alone and
// with accumulation: the loss and the head's gradient are summed in another order, so equal within
// 1e-6, not bit for bit.
TEST_P(DietWith, TheLogitsInChunksStepAsTheLogitsWhole) {
  OneStepSpec spec = small_step(GetParam());
  const OneStep whole = cpu_step(spec);
  spec.logit_chunk_bytes = 3 * static_cast<std::size_t>(spec.model.vocab) * sizeof(float);
  for (std::int64_t micro : {2, 1}) {
    spec.micro = micro;
    const OneStep chunked = cpu_step(spec);
    EXPECT_NEAR(chunked.loss, whole.loss, 1e-6 * std::fabs(whole.loss)) << micro;
    EXPECT_LT(largest_relative_difference(chunked.grads, whole.grads), 1e-6) << micro;
    EXPECT_LT(largest_relative_difference(chunked.params, whole.params), 1e-6) << micro;
    EXPECT_LT(chunked.saved_bytes, whole.saved_bytes) << "the logits are not kept";
  }
}

// Both at once: micro-batches that recompute step as the whole batch that does not.
TEST_P(DietWith, RecomputationAndAccumulationTogether) {
  OneStepSpec spec = small_step(GetParam());
  spec.rows = spec.micro = 4;
  const OneStep whole = cpu_step(spec);
  for (Recompute r : {Recompute::selective, Recompute::full}) {
    spec.recompute = r;
    spec.micro = 2;
    const OneStep parts = cpu_step(spec);
    EXPECT_NEAR(parts.loss, whole.loss, 1e-6 * std::fabs(whole.loss)) << recompute_name(r);
    EXPECT_LT(largest_relative_difference(parts.grads, whole.grads), 1e-6) << recompute_name(r);
  }
}

TEST(Recompute, NamesParseAndBadOnesAreUserErrors) {
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
    EXPECT_EQ(parse_recompute(recompute_name(r)), r);
  EXPECT_THROW(parse_recompute("some"), UserError);
}

}  // namespace
}  // namespace lmscope::test
