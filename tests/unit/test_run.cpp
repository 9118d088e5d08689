// The run layer: a RunSpec written and read back, the rules validate_run holds, and the order in
// which the step driver tells its observers of a step.
#include "../common/one_step.h"

#include "lmscope/bench/runner.h"
#include "lmscope/core/error.h"
#include "lmscope/run/run_spec.h"
#include "lmscope/run/session.h"
#include "lmscope/run/step_driver.h"

#include <gtest/gtest.h>

#include <exception>
#include <new>
#include <string>
#include <vector>

namespace lmscope {
namespace {

RunSpec tiny_run() {
  RunSpec s;
  s.model = test::tiny_model();
  s.batch = 2;
  s.ctx = 8;
  return s;
}

TEST(RunSpec, ReadsBackWhatItWrites) {
  RunSpec s = tiny_run();
  s.mode = StepMode::forward_backward;
  s.grad_accum = 3;
  s.device = "cuda";
  s.precision = "bf16";
  s.attention = AttentionKind::naive;
  s.recompute = Recompute::selective;
  s.weight_copies = WeightCopies::transient;
  s.grad_dtype = DType::bf16;
  s.graphs = false;
  s.fusion = false;
  s.seed = 17;
  s.optimizer.lr = 3e-4;
  s.optimizer.clip = 0;
  s.schedule = {.cosine = true, .lr_max = 3e-4, .lr_min = 1e-5, .warmup_iters = 10, .cosine_iters = 100};
  s.parallel.data = parallel::DataParallelSpec{};
  s.parallel.data->mode = parallel::DdpMode::overlap;
  s.parallel.data->bucket_mb = 5;
  s.parallel.data->comm_sms = 4;
  s.parallel.world.size = 2;
  const nlohmann::ordered_json j = s.to_json();
  const RunSpec back = RunSpec::from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.label(), s.label());
  EXPECT_EQ(back.model.d_ff, s.model.d_ff);
  EXPECT_EQ(back.schedule.at(50), s.schedule.at(50));
  ASSERT_TRUE(back.parallel.data.has_value());
  EXPECT_EQ(back.parallel.data->comm_sms, 4);
  EXPECT_EQ(back.label(),
            "forward-backward, selective recompute, 3 micro-batches, transient copies, bf16 gradients, graphs off, "
            "fusion off, DDP overlap, exchange on 4 SMs, 2 ranks");
}

TEST(RunSpec, RefusesADescriptionItCannotRead) {
  nlohmann::json j = tiny_run().to_json();
  j.erase("precision");
  EXPECT_THROW(RunSpec::from_json(j), UserError);
  j = tiny_run().to_json();
  j["grad_dtype"] = "fp8";
  EXPECT_THROW(RunSpec::from_json(j), UserError);
  // Each field by its kind, named with its path and what it holds.
  const auto says = [](nlohmann::json bad) {
    try {
      RunSpec::from_json(bad);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("nothing");
  };
  j = tiny_run().to_json();
  j["seed"] = -1;
  EXPECT_EQ(says(j), "a run's description gives seed the value -1, which is not a whole number from 0 to 2^64 - 1");
  j = tiny_run().to_json();
  j["grad_accum"] = 1LL << 40;
  EXPECT_EQ(says(j),
            "a run's description gives grad_accum the value 1099511627776, which is not a whole number from "
            "-2147483648 to 2147483647");
  j = tiny_run().to_json();
  j["optimizer"]["lr"] = nlohmann::json::array({1});
  EXPECT_EQ(says(j), "a run's description gives optimizer.lr the value [1], which is not a finite number");
  j = tiny_run().to_json();
  j["model"]["d_model"] = "64";
  EXPECT_EQ(says(j),
            "a run's description gives model.d_model the value \"64\", which is not a whole number from "
            "-9223372036854775808 to 9223372036854775807");
  j = tiny_run().to_json();
  j["schedule"] = 3;
  EXPECT_EQ(says(j), "a run's description gives schedule the value 3, not an object");
}

TEST(ValidateRun, HoldsTheRulesThatTieSettingsTogether) {
  RunSpec s = tiny_run();
  s.mode = StepMode::inference;
  s.grad_accum = 4;
  validate_run(s);
  EXPECT_EQ(s.grad_accum, 1);  // only a backward accumulates
  s = tiny_run();
  s.parallel.data = parallel::DataParallelSpec{};
  s.parallel.world.size = 2;
  validate_run(s);
  EXPECT_FALSE(s.graphs);  // the collectives are not recorded
  s.batch = 3;
  EXPECT_THROW(validate_run(s), UserError);  // the global batch splits across the ranks
  s = tiny_run();
  s.weight_copies = WeightCopies::transient;
  EXPECT_THROW(validate_run(s), UserError);  // fp32 weights have no copies
  s = tiny_run();
  s.mode = StepMode::forward;
  s.parallel.data = parallel::DataParallelSpec{};
  s.parallel.world.size = 2;
  EXPECT_THROW(validate_run(s), UserError);  // nothing to exchange without a backward
}

// bf16 masters: bf16 compute on CUDA in one process, with no copies to place; their gradients are
// bf16; the description keeps them, and one written before them reads as fp32 masters.
TEST(ValidateRun, Bf16MastersRunWhereTheyCan) {
  const auto says = [](RunSpec s) {
    try {
      validate_run(s);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("nothing");
  };
  RunSpec s = tiny_run();
  s.master_dtype = DType::bf16;
  s.device = "cuda";
  s.precision = "fp32";
  EXPECT_EQ(says(s), "--master-dtype bf16 needs --precision bf16 (a bf16 model computes in bf16), not fp32");
  s.precision = "bf16";
  s.device = "cpu";
  EXPECT_EQ(says(s), "--master-dtype bf16 runs on CUDA only: the CPU backend keeps its parameters in fp32");
  s.device = "cuda";
  s.weight_copies = WeightCopies::transient;
  EXPECT_EQ(says(s),
            "--weight-copies transient has nothing to place under --master-dtype bf16: the bf16 weights are the "
            "masters");
  s.weight_copies = WeightCopies::kept;
  s.parallel.data = parallel::DataParallelSpec{};
  s.parallel.world.size = 2;
  EXPECT_EQ(says(s),
            "--master-dtype bf16 runs in one process for now: with data parallelism, ZeRO or tensor parallelism it is "
            "not yet built and checked");
  s.parallel = {};
  validate_run(s);
  EXPECT_EQ(s.grad_dtype, DType::bf16);
  EXPECT_EQ(s.label(), "train, bf16 masters");
  const nlohmann::ordered_json j = s.to_json();
  EXPECT_EQ(j.at("master_dtype"), "bf16");
  EXPECT_EQ(RunSpec::from_json(nlohmann::json::parse(j.dump())).master_dtype, DType::bf16);
  nlohmann::json old = j;
  old.erase("master_dtype");
  EXPECT_EQ(RunSpec::from_json(old).master_dtype, DType::f32);
  old["master_dtype"] = "fp16";
  EXPECT_THROW(RunSpec::from_json(old), UserError);
  s.mode = StepMode::forward;
  s.grad_dtype = DType::f32;
  validate_run(s);
  EXPECT_EQ(s.grad_dtype, DType::f32);  // no backward, no gradients
  EXPECT_EQ(s.label(), "forward, bf16 masters");
}

// A cell's failure in words of ours: the C++ library's own for a host allocation were "std::bad_alloc".
TEST(FailureStatus, SaysAHostThatCannotHoldACellInOurWords) {
  EXPECT_EQ(failure_status(std::make_exception_ptr(std::bad_alloc())),
            "error: the host's memory cannot hold this cell");
}

// Every phase of every step in order, micro-batches' forward and backward K times.
TEST(StepDriver, TellsObserversEveryPhaseInOrder) {
  RunSpec s = tiny_run();
  s.grad_accum = 2;
  Session session(s);
  FixedBatch batch(s.model.vocab, s.batch, s.ctx, 0, "test.tokens");
  StepDriver driver(session, batch, true);
  struct Heard : StepObserver {
    std::vector<std::string> said;
    void step_begin(std::int64_t i) override { said.push_back("begin " + std::to_string(i)); }
    void phase_begin(StepPhase p, int k) override {
      said.push_back(std::string(step_phase_name(p)) + std::to_string(k));
    }
    void phase_end(StepPhase, int) override { said.push_back("."); }
    void step_end(const StepResult& r) override { said.push_back(r.applied ? "end" : "skipped"); }
  } heard;
  driver.add_observer(heard);
  const StepResult r = driver.step(0, 0);
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_EQ(r.lr, s.schedule.at(0));
  const std::vector<std::string> expected{"begin 0",  "forward0",   ".",         "backward0", ".",
                                          "forward1", ".",          "backward1", ".",         "gradient exchange0",
                                          ".",        "optimizer0", ".",         "end"};
  EXPECT_EQ(heard.said, expected);
  EXPECT_EQ(session.optimizer()->steps_taken(), 1);
}

// A mode without an optimizer makes none; its loss is left on the device unless asked for.
TEST(StepDriver, ForwardOnlyRunsMakeNoOptimizer) {
  RunSpec s = tiny_run();
  s.mode = StepMode::forward;
  Session session(s);
  EXPECT_EQ(session.optimizer(), nullptr);
  FixedBatch batch(s.model.vocab, s.batch, s.ctx, 0, "test.tokens");
  StepDriver driver(session, batch, false);
  EXPECT_TRUE(std::isnan(driver.step(0, 0).loss));
  EXPECT_TRUE(std::isfinite(session.model().read_loss()));
}

}  // namespace
}  // namespace lmscope
