// The memory diet's modes change memory, not results. Activation recomputation (--recompute): every
// mode gives the gradients of `none` bit for bit (fp32 on the CPU: the recomputation runs the
// forward's own ops on the same inputs) and keeps less for the backward. Gradient accumulation
// (--grad-accum): K micro-batches give the loss, gradients and AdamW step of one batch of them all.
#include "lmscope/backend/backend.h"
#include "lmscope/core/rng.h"
#include "lmscope/model/optimizer.h"
#include "lmscope/model/transformer.h"

#include <gtest/gtest.h>

#include <cmath>
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

std::vector<float> host_copy(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  be.copy_to_host(v.data(), t);
  return v;
}

// One AdamW step over `rows` sequences, taken as micro-batches of `micro` sequences each.
struct AccumulatedStep {
  double loss = 0;
  std::vector<std::vector<float>> grads, params;
};
AccumulatedStep accumulated_step(std::int64_t rows, std::int64_t micro, AttentionKind attention) {
  const std::int64_t T = 24;
  auto be = make_backend("cpu", "fp32");
  Transformer model(small_model(), *be, DType::f32, std::nullopt, attention);
  model.init_parameters(6);
  std::vector<std::int32_t> ids(rows * T), targets(rows * T);
  Rng rng(11);
  for (std::int64_t i = 0; i < rows * T; ++i) {
    ids[i] = static_cast<std::int32_t>(rng.below(37));
    targets[i] = static_cast<std::int32_t>(rng.below(37));
  }
  AdamW opt(model, OptimizerConfig{});
  AccumulatedStep s;
  const int k = static_cast<int>(rows / micro);
  for (int i = 0; i < k; ++i) {
    model.set_batch(micro, T, ids.data() + i * micro * T, targets.data() + i * micro * T);
    model.forward();
    model.backward(k, i > 0);
    s.loss += model.read_loss() / k;
  }
  for (Parameter& p : model.parameters()) s.grads.push_back(host_copy(*be, p.grad));
  opt.step(1e-3);
  for (Parameter& p : model.parameters()) s.params.push_back(host_copy(*be, p.value));
  return s;
}

// ‖a − b‖ ≤ rel·‖b‖ per tensor.
void expect_close(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b, double rel,
                  const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    double diff = 0, norm = 0;
    for (std::size_t j = 0; j < a[i].size(); ++j) {
      diff += std::pow(static_cast<double>(a[i][j]) - b[i][j], 2);
      norm += std::pow(static_cast<double>(b[i][j]), 2);
    }
    EXPECT_LE(std::sqrt(diff), rel * std::sqrt(norm)) << what << " of parameter " << i;
  }
}

TEST_P(RecomputeWith, AccumulatedMicroBatchesStepAsOneBatch) {
  const AccumulatedStep whole = accumulated_step(6, 6, GetParam());
  for (std::int64_t micro : {3, 2, 1}) {
    const AccumulatedStep parts = accumulated_step(6, micro, GetParam());
    EXPECT_NEAR(parts.loss, whole.loss, 1e-6 * std::fabs(whole.loss)) << micro;
    expect_close(parts.grads, whole.grads, 1e-6, "gradient");
    expect_close(parts.params, whole.params, 1e-6, "value after the step");
  }
}

}  // namespace
}  // namespace lmscope::test
