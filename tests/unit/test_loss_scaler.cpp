// Dynamic loss scaling: the scale's rules (GradScaler's), a scaled run equal bit for bit to the run
// without it (powers of two scale and unscale exactly, the clipping included), and a step whose
// gradients overflow skipped without touching the weights, the moments or AdamW's step count; the
// same under ZeRO-2 and ZeRO-3 on two Gloo ranks, where every rank skips the same steps. On the CPU
// in fp32 with scaling forced on; fp16 itself runs on CUDA (tests/gpu).
#include "../common/tiny_model.h"

#include "lmscope/model/optimizer.h"
#include "lmscope/run/step_driver.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace lmscope {
namespace {

TEST(LossScaler, HalvesOnOverflowAndDoublesAfterTheInterval) {
  LossScaler s({.force = true, .initial = 1024, .interval = 3}, true);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));  // the third good step in a row
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));  // an overflow starts the count again
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.state().good_steps, 0);
  EXPECT_EQ(s.skipped(), 2);
  LossScaler off({}, false);
  EXPECT_EQ(off.scale(), 1);
  EXPECT_TRUE(off.update(false));
}

TEST(LossScaler, RefusesScalesThatAreNotPowersOfTwo) {
  EXPECT_THROW(LossScaling{.initial = 1000}.validate(), UserError);
  EXPECT_THROW(LossScaling{.initial = 0}.validate(), UserError);
  EXPECT_THROW(LossScaling{.interval = 0}.validate(), UserError);
  EXPECT_NO_THROW(LossScaling{.initial = 0.25}.validate());
}

struct TrainedRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> params;
  std::int64_t adamw_steps = 0, skipped = 0;
};

// A run of the tiny model on the CPU in fp32, stepping one random batch of 2 × 9 tokens, with AdamW
// as `optimizer` says (at its lr).
struct TinyRun {
  explicit TinyRun(const OptimizerConfig& optimizer) : session(spec_of(optimizer)), batch(37, 2, 9, 5, "test") {}
  static RunSpec spec_of(const OptimizerConfig& optimizer) {
    RunSpec spec;
    spec.model = test::tiny_model();
    spec.batch = 2;
    spec.ctx = 9;
    spec.graphs = false;
    spec.seed = 3;
    spec.optimizer = optimizer;
    spec.schedule.lr_max = optimizer.lr;
    return spec;
  }
  std::vector<std::vector<double>> params() {
    std::vector<std::vector<double>> out;
    for (Parameter& p : session.model().parameters()) out.push_back(download(session.backend(), p.value));
    return out;
  }
  Session session;
  FixedBatch batch;
};

// `steps` steps of AdamW (clipping on, tight enough to bite).
TrainedRun train(const LossScaling& scaling, int steps) {
  TinyRun run({.lr = 1e-2, .clip = 0.5, .loss_scaling = scaling});
  StepDriver driver(run.session, run.batch, true);
  TrainedRun r;
  for (int i = 0; i < steps; ++i) r.losses.push_back(driver.step(i, i).loss);
  r.params = run.params();
  r.adamw_steps = run.session.optimizer()->steps_taken();
  r.skipped = run.session.optimizer()->loss_scaler().skipped();
  return r;
}

TEST(LossScaler, AScaledRunEqualsTheUnscaledOneBitForBit) {
  const TrainedRun plain = train({}, 6);
  const TrainedRun scaled = train({.force = true, .initial = 4096, .interval = 2}, 6);  // grows twice too
  EXPECT_EQ(scaled.skipped, 0);
  EXPECT_EQ(scaled.losses, plain.losses);
  EXPECT_EQ(scaled.params, plain.params);
}

TEST(LossScaler, AnOverflowingStepChangesNothingButTheScale) {
  // 2^135 times the loss's gradient is past fp32's range (2^128): skipped steps, each halving the
  // scale, until the gradients fit; then training goes on.
  const TrainedRun start = train({}, 0);
  const TrainedRun first = train({.force = true, .initial = std::ldexp(1.0, 135)}, 1);
  EXPECT_EQ(first.skipped, 1);
  EXPECT_EQ(first.adamw_steps, 0);
  EXPECT_EQ(first.params, start.params);
  const TrainedRun later = train({.force = true, .initial = std::ldexp(1.0, 135)}, 40);
  EXPECT_GT(later.skipped, 0);
  EXPECT_EQ(later.adamw_steps, 40 - later.skipped);
  EXPECT_GT(later.adamw_steps, 0);
  EXPECT_LT(later.losses.back(), later.losses.front());
}

#if LMSCOPE_HAVE_GLOO  // (a build without Gloo, the GPU machine's, has no CPU ranks)
// `steps` steps as train() takes them, on 2 Gloo ranks (threads of this process, each with its own
// CPU backend) under ZeRO `zero`, each rank a row of the batch: each rank's run, the parameters whole.
std::vector<TrainedRun> zero_train(int zero, const LossScaling& scaling, int steps) {
  // A place of its own each call: the process keeps the store it opened for a rendezvous.
  static int calls = 0;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("lmscope-zero-scaling-" + std::to_string(getpid()) + "-" + std::to_string(calls++));
  std::filesystem::remove_all(dir);
  constexpr int kRanks = 2;
  std::vector<TrainedRun> runs(kRanks);
  std::vector<std::string> failures(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      try {
        RunSpec spec = TinyRun::spec_of({.lr = 1e-2, .clip = 0.5, .loss_scaling = scaling});
        spec.parallel.world.rank = spec.parallel.world.local_rank = r;
        spec.parallel.world.size = kRanks;
        spec.parallel.world.rendezvous = "file:" + dir.string();
        spec.parallel.world.timeout = std::chrono::seconds(60);
        spec.parallel.data = parallel::DataParallelSpec{.zero = zero};
        SessionOptions options;
        options.backend = make_cpu_backend();
        Session session(spec, std::move(options));
        FixedBatch batch(37, 2, 9, 5, "test");
        StepDriver driver(session, batch, true);
        TrainedRun& run = runs[static_cast<std::size_t>(r)];
        for (int i = 0; i < steps; ++i) run.losses.push_back(driver.step(i, i).loss);
        AdamW& opt = *session.optimizer();
        for (std::size_t i = 0; i < session.model().parameters().size(); ++i) {  // a collective each
          const std::vector<float> v = opt.parameter_values(i);
          run.params.emplace_back(v.begin(), v.end());
        }
        run.adamw_steps = opt.steps_taken();
        run.skipped = opt.loss_scaler().skipped();
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (std::thread& t : ranks) t.join();
  std::filesystem::remove_all(dir);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(failures[static_cast<std::size_t>(r)], "") << "rank " << r;
  return runs;
}

// The ranks agree on every loss, parameter and skipped step.
void expect_ranks_agree(const std::vector<TrainedRun>& runs, int zero) {
  for (std::size_t r = 1; r < runs.size(); ++r) {
    EXPECT_EQ(runs[r].losses, runs[0].losses) << "ZeRO-" << zero << ", rank " << r;
    EXPECT_EQ(runs[r].params, runs[0].params) << "ZeRO-" << zero << ", rank " << r;
    EXPECT_EQ(runs[r].skipped, runs[0].skipped) << "ZeRO-" << zero << ", rank " << r;
  }
}

TEST(LossScalerUnderZero, AScaledRunEqualsTheUnscaledOneBitForBit) {
  for (int zero : {2, 3}) {
    const std::vector<TrainedRun> plain = zero_train(zero, {}, 6);
    const std::vector<TrainedRun> scaled = zero_train(zero, {.force = true, .initial = 4096, .interval = 2}, 6);
    ASSERT_EQ(scaled.size(), 2u);
    expect_ranks_agree(scaled, zero);
    EXPECT_EQ(scaled[0].skipped, 0) << "ZeRO-" << zero;
    EXPECT_EQ(scaled[0].losses, plain[0].losses) << "ZeRO-" << zero;
    EXPECT_EQ(scaled[0].params, plain[0].params) << "ZeRO-" << zero;
  }
}

TEST(LossScalerUnderZero, EveryRankSkipsAnOverflowingStepAndTrainingGoesOn) {
  for (int zero : {2, 3}) {
    const std::vector<TrainedRun> start = zero_train(zero, {}, 0);
    const std::vector<TrainedRun> first = zero_train(zero, {.force = true, .initial = std::ldexp(1.0, 135)}, 1);
    expect_ranks_agree(first, zero);
    EXPECT_EQ(first[0].skipped, 1) << "ZeRO-" << zero;
    EXPECT_EQ(first[0].adamw_steps, 0) << "ZeRO-" << zero;
    EXPECT_EQ(first[0].params, start[0].params) << "ZeRO-" << zero;
    const std::vector<TrainedRun> later = zero_train(zero, {.force = true, .initial = std::ldexp(1.0, 135)}, 40);
    expect_ranks_agree(later, zero);
    EXPECT_GT(later[0].skipped, 0) << "ZeRO-" << zero;
    EXPECT_EQ(later[0].adamw_steps, 40 - later[0].skipped) << "ZeRO-" << zero;
    EXPECT_LT(later[0].losses.back(), later[0].losses.front()) << "ZeRO-" << zero;
  }
}
#endif

// Without loss scaling (train's skip_nonfinite): a step whose gradients hold a NaN is skipped, the
// weights, the moments and the step count as they were; with finite gradients the run is the run
// without skip_nonfinite, bit for bit, clipping on or off.
struct SkipRun {
  std::vector<std::vector<double>> params;
  std::vector<std::vector<float>> moments;
  std::int64_t adamw_steps = 0;
  bool last_applied = true;
};

// Makes one gradient element NaN before the optimizer of the step it is told.
class NanGradient : public StepObserver {
 public:
  NanGradient(Session& session, std::int64_t at) : session_(session), at_(at) {}
  void step_begin(std::int64_t iteration) override { now_ = iteration; }
  void phase_begin(StepPhase phase, int) override {
    if (phase != StepPhase::optimizer || now_ != at_) return;
    Parameter& p = session_.model().parameters()[1];
    std::vector<double> g = download(session_.backend(), p.grad);
    g[g.size() / 2] = std::nan("");
    upload(session_.backend(), p.grad, g);
  }

 private:
  Session& session_;
  std::int64_t at_, now_ = -1;
};

SkipRun skip_run(double clip, bool skip, int steps, bool nan_last) {
  TinyRun run({.lr = 1e-2, .clip = clip, .loss_scaling = {}, .skip_nonfinite = skip});
  StepDriver driver(run.session, run.batch, false);
  NanGradient nan(run.session, nan_last ? steps - 1 : -1);
  driver.add_observer(nan);
  SkipRun r;
  for (int i = 0; i < steps; ++i) r.last_applied = driver.step(i, i).applied;
  r.params = run.params();
  AdamW& opt = *run.session.optimizer();
  for (std::size_t i = 0; i < run.session.model().parameters().size(); ++i)
    for (AdamW::Moment m : {AdamW::Moment::first, AdamW::Moment::second}) r.moments.push_back(opt.moment_values(i, m));
  r.adamw_steps = opt.steps_taken();
  return r;
}

TEST(SkipNonFinite, FiniteStepsAreTheSameBitForBit) {
  for (double clip : {0.0, 0.5}) {
    const SkipRun plain = skip_run(clip, false, 4, false), skipping = skip_run(clip, true, 4, false);
    EXPECT_EQ(skipping.params, plain.params) << clip;
    EXPECT_EQ(skipping.moments, plain.moments) << clip;
    EXPECT_EQ(skipping.adamw_steps, 4);
  }
}

TEST(SkipNonFinite, AStepWithANanGradientChangesNothing) {
  for (double clip : {0.0, 0.5}) {
    const SkipRun before = skip_run(clip, true, 2, false), skipped = skip_run(clip, true, 3, true);
    EXPECT_FALSE(skipped.last_applied);
    EXPECT_EQ(skipped.adamw_steps, 2);
    EXPECT_EQ(skipped.params, before.params) << clip;
    EXPECT_EQ(skipped.moments, before.moments) << clip;
    // Without skip_nonfinite the same step is applied, and the NaN spreads into the weights.
    const SkipRun applied = skip_run(clip, false, 3, true);
    EXPECT_TRUE(applied.last_applied);
    EXPECT_NE(applied.params, before.params) << clip;
  }
}

}  // namespace
}  // namespace lmscope
