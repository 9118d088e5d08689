// One training step, written once: each micro-batch's forward and backward (or, for a mode without
// one, the forward and the activations dropped), the gradients' exchange, and the optimizer at the
// schedule's learning rate. What commands want of a step beyond that (phase timing, memory marks,
// the log, checkpoints) they add as observers, not as copies of the loop. The driver marks the step
// and its phases as ranges for the trace and the device's profilers.
#pragma once

#include "lmscope/run/batch_source.h"
#include "lmscope/run/session.h"

#include <cstdint>
#include <vector>

namespace lmscope {

// forward and backward come once per micro-batch (backward also for a mode without one: its
// activations are dropped then); exchange (the data-parallel collectives waited for) and optimizer
// once a step, empty where the run has neither.
enum class StepPhase { forward, backward, exchange, optimizer };
const char* step_phase_name(StepPhase p);

struct StepResult {
  std::int64_t iteration = 0;  // from 0: the schedule's
  // The mean of the micro-batches' losses (and of the ranks'), when the driver reads it; NaN otherwise.
  double loss = 0;
  double lr = 0;
  bool applied = true;  // false: the optimizer skipped the update (an overflow under loss scaling)
};

// What an observer hears of every step, in order: step_begin; per micro-batch phase_begin/phase_end
// of forward, then of backward; of exchange; of optimizer; then step_end. Every step sends every
// phase, an empty one too, so marks taken at them line up from step to step. step_begin comes before
// the step's range opens (an observer may install a range listener there); step_end inside it.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void step_begin(std::int64_t /*iteration*/) {}
  virtual void phase_begin(StepPhase /*phase*/, int /*micro*/) {}
  virtual void phase_end(StepPhase /*phase*/, int /*micro*/) {}
  virtual void step_end(const StepResult& /*result*/) {}
};

class StepDriver {
 public:
  // read_loss: read every micro-batch's loss after its backward (a wait for the device each) and
  // give their mean; bench and memory leave the loss on the device.
  StepDriver(Session& session, BatchSource& batches, bool read_loss);
  void add_observer(StepObserver& observer) { observers_.push_back(&observer); }
  // Step `iteration` (from 0); range_index numbers it in the trace.
  StepResult step(std::int64_t iteration, std::int64_t range_index);

 private:
  template <typename F>
  void tell(F&& f) {
    for (StepObserver* o : observers_) f(*o);
  }
  Session& session_;
  BatchSource& batches_;
  bool read_loss_;
  std::vector<std::int32_t> ids_, targets_;  // the global batch
  std::vector<StepObserver*> observers_;
};

}  // namespace lmscope
