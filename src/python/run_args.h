// The Python package's RunSpec: its keywords are the command line's flags (ctx=1024 is --ctx 1024),
// read by the command line's own flag readers (cli/memory_flags.h for the run, train's optimizer
// flags, --graphs and --fusion), so that their names, defaults, checks and sentences are the
// command line's. A RunSpec describes one run: a value that would sweep (a comma list) is refused.
#pragma once

#include "lmscope/memory/memory_run.h"

#include <string>
#include <utility>
#include <vector>

namespace lmscope::python {

// Flag names without their dashes, each with its value as the command line would read it.
using RunFlags = std::vector<std::pair<std::string, std::string>>;

// The names a RunSpec takes, as flags (without dashes): the run's, not how one is measured or held
// (--warmup, --dry-run and --memory-limit are the functions' arguments).
std::vector<std::string> run_flag_names();

// How the run is used: a dry run or a real one (the default device differs: cuda for a dry run, the
// GPU when one is visible otherwise), the warm-up steps before the one measured or recorded, and the
// dry run's memory limit ("" for the device's).
struct RunUse {
  bool dry_run = false;
  int warmup = 1;
  std::string memory_limit;
};

// The run the flags describe, checked as the command line checks it (UserError, one sentence).
MemorySpec resolve_run(const RunFlags& flags, const RunUse& use);

}  // namespace lmscope::python
