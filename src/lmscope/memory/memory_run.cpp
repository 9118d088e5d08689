#include "lmscope/memory/memory_run.h"

#include "lmscope/backend/meta/meta_backend.h"
#include "lmscope/memory/memory_analysis.h"
#include "lmscope/run/session.h"
#include "lmscope/run/step_driver.h"

#include <chrono>

namespace lmscope {
namespace {

std::unique_ptr<Backend> make_cell_backend(const MemorySpec& spec, MemoryRecord& r) {
  if (spec.dry_run) {
    const DryRunTarget target = dry_run_target(spec.cell.device, spec.memory_limit);
    if (target.overhead > 0) {
      r.device = DeviceMemory{target.memory, 0, target.overhead};
      r.device_source = target.overhead_source;
    }
    return make_meta_backend(target, spec.cell.precision);
  }
  if (spec.cell.parallel.data || spec.cell.parallel.tp > 1)
    parallel::use_rank_gpu(spec.cell.parallel.world, spec.cell.device);
  std::unique_ptr<Backend> backend = make_backend(spec.cell.device, spec.cell.precision);
  if (spec.memory_limit > 0 && spec.memory_limit < backend->allocator().capacity())
    throw Unsupported("--memory-limit holds only dry runs (--dry-run) to a smaller memory than the device's");
  return backend;
}

// Where the measured step's parts begin in the allocator's record.
class StepMarks : public StepObserver {
 public:
  StepMarks(const MemorySpec& spec, MemoryRecord& r, Allocator& mem) : spec_(spec), r_(r), mem_(mem) {}
  void step_begin(std::int64_t i) override {
    measured_ = i == spec_.cell.warmup;
    if (measured_) r_.step_begin = mem_.events().size();
  }
  void phase_begin(StepPhase p, int micro) override {
    if (!measured_) return;
    if (p == StepPhase::backward && micro == 0 && has_backward(spec_.cell.mode))
      r_.backward_begin = mem_.events().size();
    if (p == StepPhase::optimizer && spec_.cell.mode == StepMode::train) r_.optimizer_begin = mem_.events().size();
  }

 private:
  const MemorySpec& spec_;
  MemoryRecord& r_;
  Allocator& mem_;
  bool measured_ = false;
};

// The record stops before the model goes (its teardown is not part of the step), on failure too.
void run_cell(const MemorySpec& spec, MemoryRecord& r) {
  std::unique_ptr<Backend> backend = make_cell_backend(spec, r);
  Allocator& mem = backend->allocator();
  LMSCOPE_CHECK(mem.current_bytes() == 0, "the backend allocated before the record began");
  r.device_name = mem.device_name();
  r.capacity = mem.capacity();
  r.start_epoch_us =
      std::chrono::duration<double, std::micro>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto stop_record = [&] {
    r.events = mem.events();
    mem.record_events(false);
  };
  mem.record_events(true);
  RunSpec checked = spec.cell;  // the run's rules before its tokens are made (a batch past them ran the host dry)
  validate_run(checked);
  // A rank's share of the batch: random tokens (what memory a step takes does not depend on them).
  FixedBatch batch(spec.cell.model.vocab, spec.cell.batch, spec.cell.ctx, spec.cell.seed, "memory.tokens");
  SessionOptions options;
  options.backend = std::move(backend);
  options.weights = InitialWeights::constant;
  options.op_by_op = true;
  options.first_batch = &batch;
  options.on_failure = stop_record;
  Session session(spec.cell, std::move(options));
  try {
    StepDriver driver(session, batch, false);
    StepMarks marks(spec, r, mem);
    driver.add_observer(marks);
    for (int i = 0; i <= spec.cell.warmup; ++i) driver.step(i, i);
    if (auto device = session.backend().device_memory()) {
      r.device = device;
      r.device_source = "cudaMemGetInfo after the step";
    }
  } catch (...) {
    stop_record();
    throw;
  }
  stop_record();
}

}  // namespace

MemoryRecord record_memory(const MemorySpec& spec, bool measure_misfit) {
  MemoryRecord r;
  r.spec = spec;
  try {
    run_cell(spec, r);
  } catch (const OutOfMemory&) {
    r.outcome = MemoryOutcome::out_of_memory;
    r.status = failure_status(std::current_exception());
  } catch (const RankFailure&) {
    throw;  // the ranks cannot go on together: every later cell would wait out the timeout
  } catch (...) {
    r.outcome = MemoryOutcome::failed;
    r.status = failure_status(std::current_exception());
  }
  if (r.outcome != MemoryOutcome::out_of_memory || !spec.dry_run || !measure_misfit) return r;
  // A dry run that does not fit says by how much: the same cell without a limit, and its need.
  MemorySpec unlimited = spec;
  unlimited.memory_limit = std::size_t(1) << 60;
  MemoryRecord whole = record_memory(unlimited);
  if (!whole.ok()) return r;
  whole.spec = spec;
  whole.capacity = r.capacity;
  whole.device = r.device;
  const std::size_t need = device_need(whole, analyze_memory(whole, 1)), limit = device_limit(r);
  whole.outcome = MemoryOutcome::does_not_fit;
  whole.status = fmt::format("does not fit: needs {} of {}", human_bytes(static_cast<double>(need)),
                             human_bytes(static_cast<double>(limit)));
  return whole;
}

}  // namespace lmscope
