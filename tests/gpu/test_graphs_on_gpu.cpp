// Device graphs on the GPU: a training run with each phase recorded once and replayed gives the bits
// of the run op by op: every step's loss, the gradient norm and every parameter after 20 steps, with
// new tokens and a new learning rate each step, a held-out forward at another batch size between
// steps, and in fp32, bf16 (kept and transient weight copies, recompute) and fp16 (a loss scale that
// overflows, so steps are skipped on the device and the scale changes), fused but for one case; bf16
// gradients fused and unfused; and fused against unfused in bf16. The
// replays must have happened, or the test would compare the eager path with itself. Skipped without a
// GPU.
#include "../common/tiny_model.h"

#include "lmscope/backend/backend.h"
#include "lmscope/backend/devices.h"
#include "lmscope/core/rng.h"
#include "lmscope/run/session.h"
#include "lmscope/run/step_driver.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace lmscope::test {
namespace {

struct Case {
  const char* precision;
  int micro_batches = 1;
  Recompute recompute = Recompute::none;
  WeightCopies copies = WeightCopies::kept;
  double loss_scale = 65536;  // fp16's first scale
  bool fusion = true;
  DType grad_dtype = DType::f32;
};

struct TrainedRun {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> params;
  std::int64_t skipped = 0;
  Backend::GraphCounts graphs;
};

// New tokens for every micro-batch and every held-out forward, from one seeded stream.
class DrawnTokens : public BatchSource {
 public:
  explicit DrawnTokens(std::int64_t tokens) : tokens_(static_cast<std::size_t>(tokens)) {}
  bool next(std::int32_t* ids, std::int32_t* targets) override {
    draw(tokens_, ids, targets);
    return true;
  }
  void draw(std::size_t n, std::int32_t* ids, std::int32_t* targets) {
    for (std::size_t i = 0; i < n; ++i) {
      ids[i] = static_cast<std::int32_t>(rng_.below(503));
      targets[i] = static_cast<std::int32_t>(rng_.below(503));
    }
  }

 private:
  std::size_t tokens_;
  Rng rng_ = Rng::stream(11, "graphs.tokens");
};

TrainedRun train(const Case& c, bool graphs) {
  RunSpec spec;
  spec.model = gpu_model();
  spec.batch = 4;
  spec.ctx = 64;
  spec.grad_accum = c.micro_batches;
  spec.device = "cuda";
  spec.precision = c.precision;
  spec.recompute = c.recompute;
  spec.weight_copies = c.copies;
  spec.grad_dtype = c.grad_dtype;
  spec.graphs = graphs;
  spec.fusion = c.fusion;
  spec.seed = 7;
  spec.optimizer.loss_scaling.initial = c.loss_scale;
  spec.schedule = {.cosine = true, .lr_max = 3e-3, .lr_min = 3e-4, .warmup_iters = 5, .cosine_iters = 20};
  Session session(spec);
  DrawnTokens tokens(spec.batch * spec.ctx);
  // Each step's loss and norm, and every seventh step a held-out forward at another shape.
  struct Record : StepObserver {
    Session& session;
    DrawnTokens& tokens;
    TrainedRun r;
    Record(Session& s, DrawnTokens& t) : session(s), tokens(t) {}
    void step_end(const StepResult& result) override {
      r.losses.push_back(result.loss);
      r.norms.push_back(session.optimizer()->last_grad_norm());
      if (result.iteration % 7 != 6) return;
      const std::int64_t ctx = session.spec().ctx;
      std::vector<std::int32_t> ids(static_cast<std::size_t>(2 * ctx)), targets(ids.size());
      tokens.draw(ids.size(), ids.data(), targets.data());
      session.model().set_batch(2, ctx, ids.data(), targets.data());
      session.model().forward(false);
      r.losses.push_back(session.model().read_loss());
    }
  } record(session, tokens);
  StepDriver driver(session, tokens, true);
  driver.add_observer(record);
  for (int step = 0; step < 20; ++step) driver.step(step, step);
  TrainedRun& r = record.r;
  for (Parameter& p : session.model().parameters()) {
    r.params.emplace_back(static_cast<std::size_t>(p.value.tensor().numel()));
    session.backend().copy_to_host(r.params.back().data(), p.value);
  }
  r.skipped = session.optimizer()->loss_scaler().skipped();
  r.graphs = session.backend().graph_counts();
  return r;
}

void expect_same_bits(const TrainedRun& a, const TrainedRun& b, const char* what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_EQ(std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(double)), 0) << what;
  EXPECT_EQ(std::memcmp(a.norms.data(), b.norms.data(), a.norms.size() * sizeof(double)), 0) << what;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    EXPECT_EQ(std::memcmp(a.params[i].data(), b.params[i].data(), a.params[i].size() * sizeof(float)), 0)
        << what << ": parameter " << i;
  EXPECT_EQ(a.skipped, b.skipped) << what;
}

TEST(GraphsOnGpu, ReplayedStepsGiveTheBitsOfStepsOpByOp) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  const Case cases[] = {
      {"fp32"},
      {"fp32", 1, Recompute::none, WeightCopies::kept, 65536, false},
      {"bf16"},
      {"bf16", 2, Recompute::selective, WeightCopies::transient},
      {"bf16", 1, Recompute::full},
      {"bf16", 1, Recompute::full, WeightCopies::transient},  // the backward's reruns cast a layer's at once
      {"fp16", 1, Recompute::none, WeightCopies::kept, std::ldexp(1.0, 28)},  // overflows: skips, halves, trains
      {"bf16", 2, Recompute::selective, WeightCopies::kept, 65536, true, DType::bf16},
      {"bf16", 1, Recompute::none, WeightCopies::kept, 65536, false, DType::bf16},
      {"bf16", 2, Recompute::none, WeightCopies::resident},
      {"bf16", 1, Recompute::full, WeightCopies::resident, 65536, false},
  };
  for (const Case& c : cases) {
    const std::string what = std::string(c.precision) + ", " + std::to_string(c.micro_batches) + " micro-batches, " +
                             recompute_name(c.recompute) + " recompute, " + weight_copies_name(c.copies) + " copies" +
                             (c.fusion ? "" : ", unfused") + (c.grad_dtype == DType::f32 ? "" : ", bf16 gradients");
    const TrainedRun eager = train(c, false), graphed = train(c, true);
    expect_same_bits(graphed, eager, what.c_str());
    EXPECT_EQ(eager.graphs.recorded + eager.graphs.replayed, 0) << what;
    // Phases replay once the allocator settles (a step or two, again after each held-out forward and,
    // under fp16, after each change of the loss scale, which the backward's graph holds).
    EXPECT_GE(graphed.graphs.replayed, 30) << what;
    EXPECT_FALSE(graphed.graphs.given_up) << what;
    if (c.loss_scale > 65536) {
      EXPECT_GT(graphed.skipped, 0) << what;
    }
    std::printf("%s: %lld graphs recorded, %lld replayed\n", what.c_str(),
                static_cast<long long>(graphed.graphs.recorded), static_cast<long long>(graphed.graphs.replayed));
  }
}

// The fused ops give the unfused ones' bits in bf16 too, where the RMSNorm backward also writes the
// residual gradient's bf16 copy for the GEMMs after it (in place of a cast): 20 steps op by op, every
// loss, norm and parameter.
TEST(GraphsOnGpu, FusedBf16StepsGiveTheUnfusedBits) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  Case fused{"bf16"}, unfused{"bf16"};
  unfused.fusion = false;
  expect_same_bits(train(fused, false), train(unfused, false), "bf16, fused against unfused");
}

}  // namespace
}  // namespace lmscope::test
