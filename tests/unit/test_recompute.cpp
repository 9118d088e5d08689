// Activation recomputation (--recompute): every mode gives the gradients of `none` bit for bit
// (fp32 on the CPU: the recomputation runs the forward's own ops on the same inputs), and keeps
// less for the backward.
#include "lmscope/backend/backend.h"
#include "lmscope/core/rng.h"
#include "lmscope/model/transformer.h"

#include <gtest/gtest.h>

#include <cstring>

namespace lmscope::test {
namespace {

ModelConfig small_model() {
  ModelConfig c;
  c.name = "tiny";
  c.vocab = 37;
  c.d_model = 32;
  c.d_ff = 48;
  c.layers = 3;
  c.heads = 2;
  return c;
}

struct Step {
  double loss = 0;
  std::vector<std::vector<float>> grads;
  std::size_t saved_bytes = 0;  // activations held when the forward ends
};

Step one_step(Recompute recompute, AttentionKind attention) {
  const std::int64_t B = 2, T = 40;
  auto be = make_backend("cpu", "fp32");
  Transformer model(small_model(), *be, DType::f32, std::nullopt, attention);
  model.set_recompute(recompute);
  model.init_parameters(5);
  std::vector<std::int32_t> ids(B * T), targets(B * T);
  Rng rng(9);
  for (std::int64_t i = 0; i < B * T; ++i) {
    ids[i] = static_cast<std::int32_t>(rng.below(37));
    targets[i] = static_cast<std::int32_t>(rng.below(37));
  }
  model.set_batch(B, T, ids.data(), targets.data());
  model.forward();
  Step s;
  s.saved_bytes = be->allocator().current_bytes(MemKind::activation);
  model.backward();
  s.loss = model.read_loss();
  for (Parameter& p : model.parameters()) {
    std::vector<float> g(static_cast<std::size_t>(p.grad.tensor().numel()));
    be->copy_to_host(g.data(), p.grad);
    s.grads.push_back(std::move(g));
  }
  return s;
}

class RecomputeWith : public ::testing::TestWithParam<AttentionKind> {};
INSTANTIATE_TEST_SUITE_P(Attention, RecomputeWith, ::testing::Values(AttentionKind::naive, AttentionKind::flash),
                         [](const auto& info) { return std::string(attention_name(info.param)); });

TEST_P(RecomputeWith, EveryModeGivesTheSameGradientsBitForBit) {
  const Step none = one_step(Recompute::none, GetParam());
  for (Recompute r : {Recompute::selective, Recompute::full}) {
    const Step other = one_step(r, GetParam());
    EXPECT_EQ(std::memcmp(&other.loss, &none.loss, sizeof(double)), 0) << recompute_name(r);
    ASSERT_EQ(other.grads.size(), none.grads.size());
    for (std::size_t i = 0; i < none.grads.size(); ++i)
      EXPECT_EQ(std::memcmp(other.grads[i].data(), none.grads[i].data(), none.grads[i].size() * sizeof(float)), 0)
          << recompute_name(r) << ": parameter " << i;
  }
}

TEST_P(RecomputeWith, KeepsLessForTheBackward) {
  const std::size_t none = one_step(Recompute::none, GetParam()).saved_bytes,
                    selective = one_step(Recompute::selective, GetParam()).saved_bytes,
                    full = one_step(Recompute::full, GetParam()).saved_bytes;
  EXPECT_LT(selective, none);
  EXPECT_LT(full, selective);
}

TEST(Recompute, NamesParseAndBadOnesAreUserErrors) {
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
    EXPECT_EQ(parse_recompute(recompute_name(r)), r);
  EXPECT_THROW(parse_recompute("some"), UserError);
}

}  // namespace
}  // namespace lmscope::test
