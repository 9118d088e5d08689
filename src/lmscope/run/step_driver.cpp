#include "lmscope/run/step_driver.h"

#include "lmscope/core/ranges.h"

#include <limits>

namespace lmscope {

const char* step_phase_name(StepPhase p) {
  switch (p) {
    case StepPhase::forward:
      return "forward";
    case StepPhase::backward:
      return "backward";
    case StepPhase::exchange:
      return "gradient exchange";
    case StepPhase::optimizer:
      return "optimizer";
  }
  return "?";
}

StepDriver::StepDriver(Session& session, BatchSource& batches, bool read_loss)
    : session_(session),
      batches_(batches),
      read_loss_(read_loss),
      ids_(static_cast<std::size_t>(session.spec().batch * session.spec().ctx)),
      targets_(ids_.size()) {}

StepResult StepDriver::step(std::int64_t iteration, std::int64_t range_index) {
  const RunSpec& spec = session_.spec();
  Transformer& model = session_.model();
  AdamW* opt = session_.optimizer();
  parallel::DataParallelRun* dp = session_.data_parallel();
  const bool backward = has_backward(spec.mode);
  const int micro_batches = spec.micro_batches();
  StepResult result;
  result.iteration = iteration;
  result.lr = spec.schedule.at(iteration);
  if (dp) dp->communicator().begin_step(iteration + 1);  // the flight record's step
  tell([&](StepObserver& o) { o.step_begin(iteration); });
  RangeListener* ranges = session_.backend().range_listener();
  ScopedRange whole(ranges, RangeLevel::step, "step", static_cast<int>(range_index));
  double loss = 0;
  for (int k = 0; k < micro_batches; ++k) {
    if (batches_.next(ids_.data(), targets_.data())) session_.set_batch(ids_.data(), targets_.data());
    tell([&](StepObserver& o) { o.phase_begin(StepPhase::forward, k); });
    {
      ScopedRange r(ranges, RangeLevel::phase, "forward");
      model.forward(spec.mode != StepMode::inference);
    }
    tell([&](StepObserver& o) { o.phase_end(StepPhase::forward, k); });
    tell([&](StepObserver& o) { o.phase_begin(StepPhase::backward, k); });
    {
      ScopedRange r(ranges, RangeLevel::phase, backward ? "backward" : "discard");
      if (backward)
        model.backward({k, micro_batches});
      else
        model.discard_activations();
    }
    tell([&](StepObserver& o) { o.phase_end(StepPhase::backward, k); });
    // The step's loss is the mean of its micro-batches' (each the mean over its tokens).
    if (read_loss_) loss += model.read_loss() / micro_batches;
  }
  tell([&](StepObserver& o) { o.phase_begin(StepPhase::exchange, 0); });
  if (dp && backward) {  // the collectives the backward started, waited for (naive and flat: run) here
    ScopedRange r(ranges, RangeLevel::phase, step_phase_name(StepPhase::exchange));
    dp->after_backward({micro_batches - 1, micro_batches});
  }
  tell([&](StepObserver& o) { o.phase_end(StepPhase::exchange, 0); });
  result.loss = read_loss_ ? session_.mean_over_ranks(loss) : std::numeric_limits<double>::quiet_NaN();
  tell([&](StepObserver& o) { o.phase_begin(StepPhase::optimizer, 0); });
  if (opt) {
    ScopedRange r(ranges, RangeLevel::phase, "optimizer");
    result.applied = opt->step(result.lr);
  }
  tell([&](StepObserver& o) { o.phase_end(StepPhase::optimizer, 0); });
  tell([&](StepObserver& o) { o.step_end(result); });
  return result;
}

}  // namespace lmscope
