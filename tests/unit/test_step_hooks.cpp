// The model's StepHooks: where a parallelism meets the step. A hook that hides every parameter outside
// the stretches that acquire it (its values NaN between release and acquire, as a sharded parallelism
// frees them) must leave the loss and gradients bit for bit as they are without hooks, in every mode:
// so the model reads no parameter outside the stretches it names. And each gradient is said final once,
// in the step's last micro-batch.
#include "../common/one_step.h"

#include "lmscope/model/step_hooks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace lmscope {
namespace {

class HidingHooks : public StepHooks {
 public:
  HidingHooks(Backend& be, Transformer& model) : be_(be) {
    for (Parameter& p : model.parameters()) saved_[&p] = test::host_floats(be_, p.value);
  }
  void acquire(std::span<Parameter* const> params, Pass) override {
    for (Parameter* p : params) {
      be_.copy_from_host(p->value, saved_.at(p).data());
      ++acquired_[p];
    }
  }
  void release(std::span<Parameter* const> params, Pass) override {
    for (Parameter* p : params) {
      std::vector<float> nan(saved_.at(p).size(), std::numeric_limits<float>::quiet_NaN());
      be_.copy_from_host(p->value, nan.data());
      --acquired_[p];
    }
  }
  void partial_sum(const Tensor&, PartialSum where, int) override { ++sums[where]; }
  void gradient_ready(std::size_t param) override { ++ready[param]; }
  // Every parameter hidden at the start, as after a release.
  void hide_all() {
    for (auto& [p, values] : saved_) release({&p, 1}, Pass::forward), ++acquired_[p];
  }
  bool balanced() const {
    for (const auto& [p, n] : acquired_)
      if (n != 0) return false;
    return true;
  }
  std::map<std::size_t, int> ready;
  std::map<PartialSum, int> sums;

 private:
  Backend& be_;
  std::map<Parameter*, std::vector<float>> saved_;
  std::map<Parameter*, int> acquired_;
};

struct Case {
  Recompute recompute;
  bool fusion;
  int micro_batches;
};

class StepHooksSee : public ::testing::TestWithParam<Case> {};

// Loss and gradients of one step, with the hiding hooks or without.
std::tuple<double, std::vector<std::vector<float>>, std::map<std::size_t, int>> step(Backend& be, const Case& c,
                                                                                     bool hooked) {
  Transformer model(test::tiny_model(), be);
  model.set_recompute(c.recompute);
  model.set_fusion(c.fusion);
  model.init_parameters(3);
  HidingHooks hooks(be, model);
  if (hooked) {
    model.set_hooks(&hooks);
    hooks.hide_all();
  }
  const double loss = test::backward_over_micro_batches(model, c.micro_batches, 2, 8, 37);
  std::vector<std::vector<float>> grads;
  for (Parameter& p : model.parameters()) grads.push_back(test::host_floats(be, p.grad));
  EXPECT_TRUE(hooks.balanced());
  if (hooked) {
    const int layers = static_cast<int>(test::tiny_model().layers);
    for (PartialSum s : {PartialSum::attention_output, PartialSum::ffn_output, PartialSum::attention_input_grad,
                         PartialSum::ffn_input_grad})
      EXPECT_EQ(hooks.sums[s],
                layers * c.micro_batches * (c.recompute == Recompute::full && s <= PartialSum::ffn_output ? 2 : 1));
    model.set_hooks(nullptr);
  }
  return {loss, grads, hooks.ready};
}

TEST_P(StepHooksSee, EveryReadOfAParameterInsideItsStretch) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  const auto [loss, grads, unheard] = step(*be, GetParam(), false);
  const auto [hooked_loss, hooked_grads, ready] = step(*be, GetParam(), true);
  EXPECT_EQ(hooked_loss, loss);
  ASSERT_EQ(hooked_grads.size(), grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) EXPECT_EQ(hooked_grads[i], grads[i]) << "parameter " << i;
  EXPECT_TRUE(unheard.empty());
  ASSERT_EQ(ready.size(), grads.size());  // every gradient said final, once, in the last micro-batch
  for (const auto& [param, times] : ready) EXPECT_EQ(times, 1) << "parameter " << param;
}

INSTANTIATE_TEST_SUITE_P(Modes, StepHooksSee,
                         ::testing::Values(Case{Recompute::none, false, 1}, Case{Recompute::none, true, 1},
                                           Case{Recompute::selective, true, 2}, Case{Recompute::full, false, 1},
                                           Case{Recompute::full, true, 2}),
                         [](const auto& info) {
                           return std::string(recompute_name(info.param.recompute)) +
                                  (info.param.fusion ? "Fused" : "Unfused") + std::to_string(info.param.micro_batches);
                         });

}  // namespace
}  // namespace lmscope
