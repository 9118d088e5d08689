#include "lmscope/memory/memory_run.h"

#include "lmscope/backend/meta/meta_backend.h"
#include "lmscope/core/rng.h"
#include "lmscope/dist/data_parallel_run.h"
#include "lmscope/memory/memory_analysis.h"
#include "lmscope/model/optimizer.h"
#include "lmscope/model/transformer.h"

#include <chrono>

namespace lmscope {
namespace {

std::unique_ptr<Backend> make_cell_backend(const MemorySpec& spec, MemoryRecord& r) {
  if (spec.dry_run) {
    const DryRunTarget target = dry_run_target(spec.cell.device, spec.memory_limit);
    if (target.overhead > 0) {
      r.device = DeviceMemory{target.memory, 0, target.overhead, 0};
      r.device_source = target.overhead_source;
    }
    return make_meta_backend(target, spec.cell.precision);
  }
  if (spec.cell.parallel) dist::use_rank_gpu(spec.cell.world, spec.cell.device);
  std::unique_ptr<Backend> backend = make_backend(spec.cell.device, spec.cell.precision);
  if (spec.memory_limit > 0 && spec.memory_limit < backend->allocator().capacity())
    throw Unsupported("--memory-limit holds only dry runs (--dry-run) to a smaller memory than the device's");
  return backend;
}

void run_steps(const MemorySpec& spec, MemoryRecord& r, Backend& backend, std::optional<Transformer>& model,
               std::unique_ptr<dist::DataParallelRun>& dp, std::unique_ptr<AdamW>& opt) {
  Allocator& mem = backend.allocator();
  const BenchSpec& c = spec.cell;
  model.emplace(c.model, backend, DType::f32, compute_dtype(c.precision), c.attention);
  model->set_recompute(c.recompute);
  model->set_weight_copies(c.weight_copies);
  model->set_grad_dtype(gradient_dtype(c.grad_dtype));
  model->set_fusion(c.fusion);
  // The op-by-op step, graphs or not: with graphs kept bf16 copies are made by the forward rather than
  // AdamW (Transformer::lowp_copy), which holds them no longer, so the record is the upper bound
  // (resident copies are held the same way either way).
  // What memory a step takes does not depend on the weights' values: a constant is as good as a
  // seeded draw, and costs nothing at 2.7B (the draw takes the host tens of seconds).
  for (Parameter& p : model->parameters()) backend.fill(p.value, 0.02);
  model->refresh_lowp_copies();
  check_parallel_mode(c);
  if (c.parallel) {  // a rank: its share of the batch, and the exchange's buffers (ZeRO-1: its shard)
    dp = std::make_unique<dist::DataParallelRun>(c.world, backend, *c.parallel);
    dp->attach(*model);
  }
  const std::int64_t local_batch = dp ? dp->local_batch(c.batch) : c.batch;
  const std::int64_t n = local_batch * c.ctx;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n)), targets(static_cast<std::size_t>(n));
  Rng rng = Rng::stream(c.seed, "memory.tokens");
  for (auto& t : ids) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(c.model.vocab)));
  for (auto& t : targets) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(c.model.vocab)));
  model->set_batch(local_batch, c.ctx, ids.data(), targets.data());
  if (c.mode == BenchMode::train) {
    opt = std::make_unique<AdamW>(*model, OptimizerConfig{}, dp ? dp->sharding() : nullptr);
    if (dp) dp->configure(*opt);
  }
  const int micro_batches = has_backward(c.mode) ? c.grad_accum : 1;
  for (int i = 0; i <= c.warmup; ++i) {
    const bool measured = i == c.warmup;
    if (measured) r.step_begin = mem.events().size();
    for (int k = 0; k < micro_batches; ++k) {
      model->forward(c.mode != BenchMode::inference);
      if (has_backward(c.mode)) {
        if (measured && k == 0) r.backward_begin = mem.events().size();
        model->backward({k, micro_batches});
        if (dp) dp->after_backward({k, micro_batches});
      } else {
        model->discard_activations();
      }
    }
    if (opt) {
      if (measured) r.optimizer_begin = mem.events().size();
      opt->step(1e-3);
    }
  }
  if (auto device = backend.device_memory()) {
    r.device = device;
    r.device_source = "cudaMemGetInfo after the step";
  }
}

// The record stops before the model goes (its teardown is not part of the step), on failure too.
void run_cell(const MemorySpec& spec, MemoryRecord& r, std::unique_ptr<Backend>& backend) {
  backend = make_cell_backend(spec, r);
  Allocator& mem = backend->allocator();
  LMSCOPE_CHECK(mem.current_bytes() == 0, "the backend allocated before the record began");
  r.device_name = mem.device_name();
  r.capacity = mem.capacity();
  r.start_epoch_us =
      std::chrono::duration<double, std::micro>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::optional<Transformer> model;
  std::unique_ptr<dist::DataParallelRun> dp;  // before the optimizer it shards, after the model it hooks into
  std::unique_ptr<AdamW> opt;
  mem.record_events(true);
  try {
    run_steps(spec, r, *backend, model, dp, opt);
  } catch (...) {
    r.events = mem.events();
    mem.record_events(false);
    throw;
  }
  r.events = mem.events();
  mem.record_events(false);
}

}  // namespace

MemoryRecord record_memory(const MemorySpec& spec, bool measure_misfit) {
  MemoryRecord r;
  r.spec = spec;
  {
    std::unique_ptr<Backend> backend;
    try {
      run_cell(spec, r, backend);
    } catch (const OutOfMemory&) {
      r.outcome = MemoryOutcome::out_of_memory;
      r.status = failure_status(std::current_exception());
    } catch (const RankFailure&) {
      throw;  // the ranks cannot go on together: every later cell would wait out the timeout
    } catch (...) {
      r.outcome = MemoryOutcome::failed;
      r.status = failure_status(std::current_exception());
    }
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
