// lmscope memory: one step's every allocation and free, recorded after warm-up (on the device, or
// by the dry run standing for it), and what they say: the peak and what holds it, by kind, by op
// and by buffer; each phase's peak; the whole device. A snapshot for PyTorch's memory viewer and a
// timeline picture on request. Comma lists sweep; a failing cell becomes a row.
#include "commands.h"
#include "memory_flags.h"
#include "model_flags.h"
#include "sweep_output.h"

#include "lmscope/io/durable_file.h"
#include "lmscope/memory/memory_report.h"
#include "lmscope/memory/snapshot.h"
#include "lmscope/memory/timeline_svg.h"

namespace lmscope::cli {
namespace {

class MemoryCommand : public Command {
 public:
  explicit MemoryCommand(CLI::App& parent) {
    app = parent.add_subcommand("memory",
                                "Record one step's every allocation: the peak and what holds it, per phase, by "
                                "kind, op and buffer; snapshots for memory_viz; comma lists sweep");
    cells_.add_to(*app);
    app->add_option("--top", top_, "How many of the largest live buffers at the peak to list")->capture_default_str();
    app->add_option("--format", format_, "md, csv or json")->capture_default_str();
    app->add_option("--out", out_,
                    "Write the results here in --format, updated after every cell (the Markdown report still prints)");
    app->add_option("--snapshot", snapshot_,
                    "Write the cell's step as a PyTorch memory snapshot (.pickle) that pytorch.org/memory_viz opens");
    app->add_option("--svg", svg_, "Draw the cell's active-memory timeline as an SVG");
    app->add_option("--svg-by", svg_by_, "Stack the timeline by kind or by layer")->capture_default_str();
  }

  int run() override {
    // Everything is checked before the first cell runs, so a typo never costs a half-run sweep.
    const std::vector<MemorySpec> cells = cells_.resolve();
    if (top_ <= 0) user_error("--top must be positive, got {}", top_);
    const ReportFormat format = parse_report_format(format_);
    if (svg_by_ != "kind" && svg_by_ != "layer") user_error("unknown --svg-by '{}' (use kind or layer)", svg_by_);
    if ((!snapshot_.empty() || !svg_.empty()) && cells.size() != 1)
      user_error("--snapshot and --svg draw one cell, and the flags make {}", cells.size());
    check_ranks_run_the_same_cells(cells);
    // With data parallelism every rank runs every cell (the collectives need them all); rank 0 reports.
    const bool reports = cells.empty() || cells.front().cell.parallel.world.rank == 0;
    if (reports) {
      for (const auto& [flag, path] :
           {std::pair{"--out", &out_}, std::pair{"--snapshot", &snapshot_}, std::pair{"--svg", &svg_}})
        if (!path->empty()) check_writable(*path, flag);  // fail now, not after the sweep
      warn_of_cells_that_cannot_fit(cells);
    }

    SweepProgress shown;
    std::vector<MemoryRow> rows;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      if (reports) shown.start(fmt::format("[{}/{}] {}", i + 1, cells.size(), cell_label(cells[i])));
      MemoryRecord record = record_memory(cells[i]);
      if (!reports) continue;
      shown.finish(record.status);
      if (!snapshot_.empty() && !record.events.empty()) write_file(snapshot_, memory_snapshot_pickle(record));
      if (!svg_.empty() && record.has_step())
        write_file(svg_, memory_timeline_svg(record, analyze_memory(record, top_),
                                             svg_by_ == "layer" ? TimelineStack::layer : TimelineStack::kind));
      rows.push_back(memory_row(std::move(record), top_));
      if (!out_.empty()) write_file(out_, format_memory(rows, format));
    }
    if (reports) fmt::print("{}", format_memory(rows, out_.empty() ? format : ReportFormat::markdown));
    return 0;
  }

 private:
  MemoryCellFlags cells_;
  int top_ = 10;
  std::string format_ = "md", out_, snapshot_, svg_, svg_by_ = "kind";
};

}  // namespace

std::unique_ptr<Command> add_memory_command(CLI::App& parent) { return std::make_unique<MemoryCommand>(parent); }

}  // namespace lmscope::cli
