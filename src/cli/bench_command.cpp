// lmscope bench: per-phase timings over a sweep of models, contexts, batches, modes, devices and
// precisions. A failing cell (out of memory, unsupported) becomes a row and the sweep goes on.
#include "commands.h"
#include "memory_flags.h"
#include "model_flags.h"
#include "sweep_output.h"

#include "lmscope/backend/backend.h"
#include "lmscope/bench/report.h"
#include "lmscope/io/durable_file.h"
#include "lmscope/memory/memory_analysis.h"

namespace lmscope::cli {
namespace {

class BenchCommand : public Command {
 public:
  explicit BenchCommand(CLI::App& parent) {
    app = parent.add_subcommand("bench", "Time forward, backward and optimizer steps; comma lists sweep");
    cells_.warmup = 5;
    cells_.warmup_help = "Untimed steps first";
    cells_.seed_help = "Seed for weights and tokens";
    cells_.dry_run_help =
        "Time nothing: run each cell on the shape-only backend and report its peak memory and whether it fits "
        "(--device cuda without a GPU stands for an H100 80GB HBM3)";
    cells_.add_to(*app);
    app->add_option("--steps", steps_, "Measured steps")->capture_default_str();
    app->add_option("--format", format_, "md, csv or json")->capture_default_str();
    app->add_option("--out", out_,
                    "Write the results here in --format, updated after every cell (the Markdown table still prints)");
    app->add_flag("--profile", profile_,
                  "Trace every kernel of the measured steps (CUDA, CUPTI): time by phase, op category and kernel, "
                  "and how long the GPU waited for launches");
    app->add_option("--graphs", graphs_,
                    "on: each phase runs as one CUDA graph, recorded once and replayed; off: op by op; on,off "
                    "runs both (no effect on the CPU)")
        ->capture_default_str();
    app->add_option("--fusion", fusion_,
                    "on: the fused kernels (the residual add with the RMSNorm after it, forward and backward; the "
                    "optimizer step in a few launches); off: the unfused ops; on,off runs both")
        ->capture_default_str();
    app->add_option("--trace", trace_,
                    "Write the measured steps of the one cell as a Chrome trace (ui.perfetto.dev, chrome://tracing): "
                    "each step, phase, layer and op on the host thread, and the allocator's bytes as counters");
  }

  int run() override {
    // Everything is checked before the first cell runs, so a typo never costs a half-run sweep.
    std::vector<MemorySpec> planned;
    const std::vector<bool> graph_modes = on_off_list("--graphs", graphs_);
    for (const MemorySpec& cell : cells_.resolve())
      for (bool fusion : on_off_list("--fusion", fusion_))
        for (bool graphs : graph_modes) {
          // Data and tensor parallelism run op by op (their collectives are not recorded): their cells
          // say so, once.
          const bool ranks = cell.cell.parallel.data || cell.cell.parallel.tp > 1;
          if (ranks && graphs && graph_modes.size() > 1) continue;
          planned.push_back(cell);
          planned.back().cell.fusion = fusion;
          planned.back().cell.graphs = graphs && !ranks;
        }
    if (steps_ <= 0) user_error("--steps must be positive, got {}", steps_);
    if (profile_ && cells_.dry_run()) user_error("--profile traces kernels, and a dry run runs none");
    if (!trace_.empty() && cells_.dry_run()) user_error("--trace records a run, and a dry run runs nothing");
    if (!trace_.empty() && planned.size() != 1)
      user_error("--trace records one cell, and the flags make {}", planned.size());
    for (MemorySpec& s : planned) {
      if (profile_ && s.cell.device == "cpu") user_error("--profile traces GPU kernels; it needs --device cuda");
      s.cell.steps = steps_;
      s.cell.profile = profile_;
      s.cell.trace = !trace_.empty();
    }
    const ReportFormat format = parse_report_format(format_);
    check_ranks_run_the_same_cells(planned);
    // With data parallelism every rank runs every cell (the collectives need them all); rank 0 reports.
    const bool reports = planned.empty() || planned.front().cell.parallel.world.rank == 0;
    if (reports) {
      for (const auto& [flag, path] : {std::pair{"--out", &out_}, std::pair{"--trace", &trace_}})
        if (!path->empty()) check_writable(*path, flag);  // fail now, not after the sweep
      warn_of_cells_that_cannot_fit(planned);             // a dry run's rows say it themselves
    }

    SweepProgress shown;
    std::vector<BenchResult> rows;
    BenchSweep sweep;
    for (std::size_t i = 0; i < planned.size(); ++i) {
      const BenchSpec& s = planned[i].cell;
      if (reports) shown.start(fmt::format("[{}/{}] {}", i + 1, planned.size(), cell_label(planned[i])));
      auto progress = [&](int done, int total) {
        if (reports) shown.step(done, total, done <= s.warmup ? " (warm-up)" : "");
      };
      const BenchSpec* next = i + 1 < planned.size() ? &planned[i + 1].cell : nullptr;
      rows.push_back(cells_.dry_run() ? dry_run_cell(planned[i]) : sweep.run(s, next, progress));
      if (!reports) continue;
      shown.finish(rows.back().status);
      if (!trace_.empty() && !rows.back().trace.empty()) write_file(trace_, rows.back().trace);
      // Rewritten after every cell: an interrupted sweep keeps every row it finished.
      if (!out_.empty()) write_file(out_, format_bench(rows, format));
    }
    if (reports) fmt::print("{}", format_bench(rows, out_.empty() ? format : ReportFormat::markdown));
    return 0;
  }

 private:
  MemoryCellFlags cells_;
  std::string format_ = "md", out_, trace_, graphs_ = "on", fusion_ = "on";

  static std::vector<bool> on_off_list(const char* flag, const std::string& text) {
    std::vector<bool> values;
    for (const std::string& v : split_list(text)) {
      if (v != "on" && v != "off") user_error("unknown {} '{}' (use on, off or on,off)", flag, v);
      values.push_back(v == "on");
    }
    return values;
  }
  int steps_ = 10;
  bool profile_ = false;

  // A bench row with what the dry run knows: the peak, and whether the cell fits.
  static BenchResult dry_run_cell(const MemorySpec& cell) {
    const MemoryRecord record = record_memory(cell);
    BenchResult r;
    r.spec = cell.cell;
    r.dry_run = true;
    r.status = record.status;
    r.device_name = record.device_name;
    if (record.has_step()) r.peak_bytes = analyze_memory(record, 1).peak;
    return r;
  }
};

}  // namespace

std::unique_ptr<Command> add_bench_command(CLI::App& parent) { return std::make_unique<BenchCommand>(parent); }

}  // namespace lmscope::cli
