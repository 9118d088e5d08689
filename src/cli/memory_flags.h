// The flags that choose memory cells (memory, and bench and info with --dry-run): model, shape,
// device, precision, attention and mode lists that sweep, the warm-up, and the dry run's
// --dry-run and --memory-limit.
#pragma once

#include "model_flags.h"

#include "lmscope/memory/memory_run.h"

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace lmscope::cli {

class MemoryCellFlags {
 public:
  // with_dry_run_flags: add --dry-run and --memory-limit (a command that has its own leaves them off).
  void add_to(CLI::App& app, bool with_dry_run_flags = true);
  std::vector<MemorySpec> resolve() const;  // every combination, checked; UserError on bad input
  bool dry_run() const { return dry_run_; }
  std::size_t memory_limit() const;  // 0: the device's

  std::string ctx = "256", batch = "4", mode = "train", device, precision = "fp32", attention = "flash";
  int warmup = 1;

 private:
  ModelFlags model_;
  bool dry_run_ = false;
  std::string memory_limit_;
  std::uint64_t seed_ = 0;
};

std::string cell_label(const MemorySpec& spec);
// Dry-runs each cell that will run for real and warns on stderr of those that cannot fit, before a
// sweep walks into them.
void warn_of_cells_that_cannot_fit(const std::vector<MemorySpec>& cells);

}  // namespace lmscope::cli
