// lmscope plan: what fits a memory budget, found by dry runs (no GPU needed, nothing computed).
// For a model, device, precision and attention: the step's peak and the whole device's need at a
// reference shape, its FLOPs per token, and the largest context (at the reference batch) and the
// largest batch (at the reference context) whose step fits.
#pragma once

#include "lmscope/bench/report.h"
#include "lmscope/memory/memory_run.h"

#include <functional>
#include <string>
#include <vector>

namespace lmscope {

struct PlanSpec {
  BenchSpec reference;              // model, device, precision, attention, mode, batch, ctx, warmup
  std::int64_t ctx_multiple = 128;  // contexts searched: its multiples
  std::size_t memory_limit = 0;     // 0: the device's (dry_run_target)
};

// The search gives up past these, and says so.
constexpr std::int64_t kPlanMaxCtx = std::int64_t(1) << 22, kPlanMaxBatch = std::int64_t(1) << 16;

struct PlanRow {
  PlanSpec spec;
  std::string device_name;  // what the dry run stands for
  std::size_t limit = 0;    // the budget, the whole device
  // The reference shape: its status ("ok", "does not fit: needs X of Y", or why it failed), the
  // step's peak of allocated bytes and what the whole device needs for it (when the step ran).
  MemoryOutcome reference_outcome = MemoryOutcome::ok;
  std::string reference_status;
  std::size_t reference_peak = 0, reference_need = 0;
  double flops_per_token = 0;  // of the mode, at the reference context
  // 0 when nothing fits; at the cap (kPlanMax*) when everything up to it fits.
  std::int64_t largest_ctx = 0, largest_batch = 0;
  std::string failed_probe;  // the first probe that failed other than by memory (counted as not fitting)
};

// The largest multiple of `step` no greater than `cap` for which fits() holds, assuming a larger
// value never fits where a smaller one does not; 0 when `step` itself does not fit. fits() is
// called about 2·log2(cap/step) times.
std::int64_t largest_fitting(std::int64_t step, std::int64_t cap, const std::function<bool(std::int64_t)>& fits);

PlanRow plan_cell(const PlanSpec& spec);

std::string format_plan(const std::vector<PlanRow>& rows, ReportFormat f);

}  // namespace lmscope
