#include "run_args.h"

#include "cli/memory_flags.h"
#include "cli/strict_numbers.h"
#include "cli/train_settings.h"

#include "lmscope/core/error.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <set>

namespace lmscope::python {
namespace {

// What the flags are read into: a memory cell (model, shape, mode, device, precision, attention,
// recompute, micro-batches, weight copies, gradients' dtype, seed, the data-parallel layout), the
// optimizer and its schedule as train reads them, and bench's --graphs and --fusion.
struct RunFlagReader {
  CLI::App app{"lmscope RunSpec"};
  cli::MemoryCellFlags cells;
  OptimizerConfig optimizer;
  LrSchedule schedule;
  std::string lr_schedule = "constant", graphs = "on", fusion = "on";

  explicit RunFlagReader(int warmup) {
    cells.warmup = warmup;
    cells.add_to(app);
    cli::add_optimizer_flags(app, optimizer, schedule, lr_schedule);
    app.add_option("--graphs", graphs, "on or off: each phase as one device graph (CUDA)")->capture_default_str();
    app.add_option("--fusion", fusion, "on or off: the fused kernels")->capture_default_str();
    cli::read_numbers_strictly(app);
  }
};

// How the functions, not the RunSpec, set these.
const std::set<std::string> kUseFlags = {"help", "warmup", "dry-run", "memory-limit"};

}  // namespace

std::vector<std::string> run_flag_names() {
  RunFlagReader reader(1);
  std::vector<std::string> names;
  for (const CLI::Option* o : reader.app.get_options())
    for (const std::string& name : o->get_lnames())
      if (kUseFlags.count(name) == 0) names.push_back(name);
  return names;
}

MemorySpec resolve_run(const RunFlags& flags, const RunUse& use) {
  RunFlagReader reader(use.warmup);
  std::vector<std::string> args;
  for (const auto& [name, value] : flags) {
    if (kUseFlags.count(name) > 0) user_error("--{} is not part of a run's description", name);
    if (value.empty()) throw UserError(cli::empty_value_error("--" + name));
    if (value.find(',') != std::string::npos)
      user_error("a RunSpec describes one run, and {}='{}' names several: give one value (sweep in Python)", name,
                 value);
    args.push_back("--" + name);
    args.push_back(value);
  }
  if (use.dry_run) args.emplace_back("--dry-run");
  if (!use.memory_limit.empty()) {
    args.emplace_back("--memory-limit");
    args.push_back(use.memory_limit);
  }
  std::reverse(args.begin(), args.end());  // CLI11 reads a vector from its back
  try {
    reader.app.parse(args);
  } catch (const CLI::ParseError& e) {
    throw UserError(e.what());
  }
  for (const auto& [flag, value] : {std::pair{"--graphs", &reader.graphs}, std::pair{"--fusion", &reader.fusion}})
    if (*value != "on" && *value != "off") user_error("unknown {} '{}' (use on or off)", flag, *value);
  if (reader.lr_schedule == "cosine" && reader.schedule.cosine_iters == 0)
    user_error("lr_schedule='cosine' needs cosine_iters, the step where the rate reaches min_lr");
  cli::settle_optimizer(reader.optimizer, reader.schedule, reader.lr_schedule, 0);
  std::vector<MemorySpec> cells = reader.cells.resolve();
  MemorySpec run = cells.front();  // one: no value above named several
  run.cell.graphs = reader.graphs == "on";
  run.cell.fusion = reader.fusion == "on";
  run.cell.optimizer = reader.optimizer;
  run.cell.schedule = reader.schedule;
  RunSpec checked = run.cell;  // as the commands report it: what validate_run fills in stays out
  validate_run(checked);
  return run;
}

}  // namespace lmscope::python
