// ZeRO-3's contract with the model under mixed precision, on one GPU: between stretches no parameter
// exists (neither master nor copy), and a stretch is given its matrix weights only as their bf16
// copies and the rest (embedding, norms) as fp32 masters, as parallel/zero_sharding.cpp's gathers give
// them. Hooks that do the same from saved values, without ranks, must leave the loss and gradients bit
// for bit as the model's own with kept or transient copies, under every recompute mode, with fusion on
// and off and over micro-batches: so the model never reads a matrix weight's master inside a stretch
// either. (The CPU computes in fp32 only, where tests/unit/test_step_hooks.cpp holds the stretches.)
// Skipped without a GPU.
#include "lmscope/backend/backend.h"
#include "lmscope/backend/devices.h"
#include "lmscope/model/step_hooks.h"

#include "../common/one_step.h"
#include "../common/tiny_model.h"

#include <gtest/gtest.h>

#include <map>
#include <tuple>
#include <vector>

namespace lmscope::test {
namespace {

class GatheringHooks : public StepHooks {
 public:
  // Keeps every master's values, then frees every master and copy, as ZeRO-3 leaves a model.
  GatheringHooks(Backend& be, Transformer& model) : be_(be), model_(model) {
    for (Parameter& p : model.parameters()) {
      saved_[&p] = download(be, p.value);
      p.value.reset();
      p.value_lowp.reset();
    }
  }
  void acquire(std::span<Parameter* const> params, Pass) override {
    for (Parameter* p : params) {
      ASSERT_TRUE(p->value.empty() && p->value_lowp.empty()) << p->spec.name << " acquired twice";
      Allocation master = be_.allocator().allocate(p->spec.shape, model_.dtype(), {MemKind::parameter, "m", -1});
      upload(be_, master, saved_.at(p));
      if (p->spec.matmul && model_.compute_dtype() != model_.dtype()) {
        p->value_lowp =
            be_.allocator().allocate(p->spec.shape, model_.compute_dtype(), {MemKind::parameter, "copy", -1});
        be_.cast(master, p->value_lowp);
      } else {
        p->value = std::move(master);
      }
    }
  }
  void release(std::span<Parameter* const> params, Pass) override {
    for (Parameter* p : params) {
      p->value.reset();
      p->value_lowp.reset();
    }
  }

 private:
  Backend& be_;
  Transformer& model_;
  std::map<Parameter*, std::vector<double>> saved_;
};

struct Case {
  Recompute recompute;
  WeightCopies copies;
  bool fusion;
  int micro_batches;
};

class ShardedWeightsOnGpu : public ::testing::TestWithParam<Case> {};

std::tuple<double, std::vector<std::vector<double>>> step(Backend& be, const Case& c, bool gathered) {
  Transformer model(gpu_model(), be, DType::f32, DType::bf16);
  model.set_recompute(c.recompute);
  model.set_weight_copies(c.copies);
  model.set_fusion(c.fusion);
  model.set_graphs(false);  // as with any data parallelism
  model.init_parameters(3);
  std::optional<GatheringHooks> hooks;
  if (gathered) {
    hooks.emplace(be, model);
    model.set_hooks(&*hooks);
  }
  const double loss = backward_over_micro_batches(model, c.micro_batches, 2, 64, gpu_model().vocab);
  std::vector<std::vector<double>> grads;
  for (Parameter& p : model.parameters()) grads.push_back(download(be, p.grad));
  if (gathered) {
    for (Parameter& p : model.parameters())
      EXPECT_TRUE(p.value.empty() && p.value_lowp.empty()) << p.spec.name << " left whole after the step";
    model.set_hooks(nullptr);
  }
  return {loss, grads};
}

TEST_P(ShardedWeightsOnGpu, StretchesReadMatrixWeightsOnlyAsTheirCopies) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  auto be = make_backend("cuda", "bf16");
  const auto [loss, grads] = step(*be, GetParam(), false);
  const auto [gathered_loss, gathered_grads] = step(*be, GetParam(), true);
  EXPECT_EQ(gathered_loss, loss);
  ASSERT_EQ(gathered_grads.size(), grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) EXPECT_EQ(gathered_grads[i], grads[i]) << "parameter " << i;
}

INSTANTIATE_TEST_SUITE_P(Modes, ShardedWeightsOnGpu,
                         ::testing::Values(Case{Recompute::none, WeightCopies::kept, false, 1},
                                           Case{Recompute::none, WeightCopies::kept, true, 1},
                                           Case{Recompute::none, WeightCopies::transient, true, 1},
                                           Case{Recompute::selective, WeightCopies::kept, true, 2},
                                           Case{Recompute::full, WeightCopies::kept, false, 1},
                                           Case{Recompute::full, WeightCopies::transient, true, 2}),
                         [](const auto& info) {
                           return std::string(recompute_name(info.param.recompute)) +
                                  weight_copies_name(info.param.copies) + (info.param.fusion ? "Fused" : "Unfused") +
                                  std::to_string(info.param.micro_batches);
                         });

}  // namespace
}  // namespace lmscope::test
