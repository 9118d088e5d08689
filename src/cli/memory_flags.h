// The flags that choose the cells of a sweep (memory, bench and plan): model, shape,
// device, precision, attention and mode lists that sweep, the warm-up, and the dry run's
// --dry-run and --memory-limit.
#pragma once

#include "model_flags.h"
#include "parallel_flags.h"

#include "lmscope/memory/memory_run.h"

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace lmscope::cli {

class MemoryCellFlags {
 public:
  // with_dry_run_flags: add --dry-run and --memory-limit (a command that has its own leaves them off).
  // The data-parallel flags (--ddp, --zero, ...; --world-size with the dry-run flags) come with them.
  void add_to(CLI::App& app, bool with_dry_run_flags = true);
  // Before add_to: every cell is a dry run (plan's), --dry-run being accepted and implied.
  void always_dry_run() { dry_run_ = always_dry_ = true; }
  // Before add_to: the --model default (a comma list sweeps).
  void set_default_models(std::string models) { model_.set_default(std::move(models)); }
  std::vector<MemorySpec> resolve() const;  // every combination, checked; UserError on bad input
  bool dry_run() const { return dry_run_; }
  std::size_t memory_limit() const;  // 0: the device's

  std::string ctx = "256", batch = "4", mode = "train", device, precision = "fp32", attention = "flash",
              recompute = "none", grad_accum = "1", weight_copies = "kept", grad_dtype = "fp32", master_dtype = "fp32";
  int warmup = 1;
  std::string warmup_help = "Steps before the one recorded", seed_help = "Seed for the tokens",
              dry_run_help =
                  "Compute nothing: run the model on a shape-only backend that allocates exactly as the device "
                  "would (--device cuda without a GPU stands for an H100 80GB HBM3)";

 private:
  ModelFlags model_;
  ParallelFlags parallel_;
  bool dry_run_ = false, always_dry_ = false;
  std::string memory_limit_;
  std::uint64_t seed_ = 0;
};

// --memory-limit's help, naming the default the dry run holds cuda to without a GPU.
std::string memory_limit_help();
std::string cell_label(const MemorySpec& spec);
// Dry-runs each cell that will run for real and warns on stderr of those that cannot fit, before a
// sweep walks into them.
void warn_of_cells_that_cannot_fit(const std::vector<MemorySpec>& cells);
// With data parallelism every rank runs every cell (the collectives need them all): before the first,
// the cells each rank's flags make are compared with rank 0's (check_ranks_agree). Not for a dry run,
// whose ranks never meet.
void check_ranks_run_the_same_cells(const std::vector<MemorySpec>& cells);

}  // namespace lmscope::cli
