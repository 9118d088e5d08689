// lmscope plan --recommend: for a model, precision and attention, a context and a number of
// sequences per optimizer step, the fastest way to train it within the memory budget.
//
// The ways are the recomputations (none, selective, the first j layers in full and the rest selective
// for j = 1 .. layers - 1, full: model/recompute.h), times where the bf16 weight copies live
// under mixed precision (resident: refreshed in place by AdamW, tried only under device graphs, where
// the forward would cast kept ones; kept; or transient: cast per layer where used), times the ways of
// splitting the step's sequences into micro-batches (1, 2, 4, ... of them, --grad-accum), and, over
// ranks, times the ZeRO stages from the cell's up (docs/sharding.md). Dry runs say which fit.
// Recomputing more, copies kept rather than resident or transient rather than kept, a higher stage
// and splitting finer each only add work, so a way is a candidate only where it fits and no candidate
// found before it (a coarser split, or this split with a lower stage or copies of less work) is
// cheaper or equal on every other count. What the candidates then cost
// depends on the shape (docs/memory.md: two micro-batches cost 23% at 2.7B ctx 256 and 6% at ctx
// 1024, full recompute 16% and 26%), so with `measure` each runs for real and the fastest is named;
// without, the coarsest split with the least recomputation is named and the table says the choice
// was not timed.
#pragma once

#include "lmscope/bench/report.h"
#include "lmscope/bench/runner.h"
#include "lmscope/memory/memory_run.h"

#include <optional>
#include <string>
#include <vector>

namespace lmscope {

struct RecommendSpec {
  BenchSpec cell;                // model, device, precision, attention, ctx; batch: sequences per step
  std::size_t memory_limit = 0;  // 0: the device's (dry_run_target)
  bool measure = false;          // time the candidates on the device
  int measure_steps = 3;         // measured steps per candidate (after cell.warmup warm-up steps)
};

struct Candidate {
  BenchSpec spec;                  // batch: per micro-batch; grad_accum: micro-batches
  std::size_t peak = 0, need = 0;  // the dry run's peak allocated and whole-device need
  std::optional<double> step_ms;   // mean measured step time, when measured
  std::string status = "ok";       // the measured run's, when it did not end "ok"
};

struct Recommendation {
  RecommendSpec spec;
  std::string device_name;
  std::size_t limit = 0;              // the budget, the whole device
  std::vector<Candidate> candidates;  // coarsest split first; empty when nothing fits
  int chosen = -1;                    // index into candidates; -1 when nothing fits
  std::string failure;                // a dry run that failed other than by memory
  bool timed() const { return chosen >= 0 && candidates[chosen].step_ms.has_value(); }
};

Recommendation recommend(const RecommendSpec& spec);

std::string format_recommendations(const std::vector<Recommendation>& rows, ReportFormat f);

}  // namespace lmscope
