// lmscope bench: per-phase timings over a sweep of models, contexts, batches, modes, devices and
// precisions. A failing cell (out of memory, unsupported) becomes a row and the sweep goes on.
#include "commands.h"
#include "memory_flags.h"
#include "model_flags.h"
#include "sweep_output.h"

#include "lmscope/backend/backend.h"
#include "lmscope/bench/report.h"
#include "lmscope/memory/memory_analysis.h"

#include <algorithm>

namespace lmscope::cli {
namespace {

class BenchCommand : public Command {
 public:
  explicit BenchCommand(CLI::App& parent) {
    app = parent.add_subcommand("bench", "Time forward, backward and optimizer steps; comma lists sweep");
    model_.add_to(*app, true);
    app->add_option("--ctx", ctx_, "Context length(s)")->capture_default_str();
    app->add_option("--batch", batch_, "Batch size(s)")->capture_default_str();
    app->add_option("--mode", mode_,
                    "inference (a forward that keeps nothing for backward), forward, forward-backward or train "
                    "(comma list sweeps)")
        ->capture_default_str();
    app->add_option("--warmup", warmup_, "Untimed steps first")->capture_default_str();
    app->add_option("--steps", steps_, "Measured steps")->capture_default_str();
    app->add_option("--device", device_, "cpu or cuda (comma list sweeps; default: cuda when a GPU is visible)");
    app->add_option("--precision", precision_, "fp32, tf32 or bf16 (comma list sweeps)")->capture_default_str();
    app->add_option("--attention", attention_, "flash or naive (comma list sweeps)")->capture_default_str();
    app->add_option("--recompute", recompute_, recompute_help(true))->capture_default_str();
    app->add_option("--grad-accum", grad_accum_, grad_accum_help(true))->capture_default_str();
    app->add_option("--format", format_, "md, csv or json")->capture_default_str();
    app->add_option("--out", out_,
                    "Write the results here in --format, updated after every cell (the Markdown table still prints)");
    app->add_option("--seed", seed_, "Seed for weights and tokens")->capture_default_str();
    app->add_flag("--dry-run", dry_run_,
                  "Time nothing: run each cell on the shape-only backend and report its peak memory and whether it "
                  "fits (--device cuda without a GPU stands for an H100 80GB HBM3)");
    app->add_option("--memory-limit", memory_limit_, memory_limit_help());
    app->add_flag("--profile", profile_,
                  "Trace every kernel of the measured steps (CUDA, CUPTI): time by phase, op category and kernel, "
                  "and how long the GPU waited for launches");
  }

  int run() override {
    // Everything is checked before the first cell runs, so a typo never costs a half-run sweep.
    const auto models = model_.resolve();
    const auto ctxs = parse_positive_list("--ctx", ctx_), batches = parse_positive_list("--batch", batch_);
    std::vector<BenchMode> modes;
    for (const auto& m : split_list(mode_)) modes.push_back(parse_bench_mode(m));
    const auto devices = split_list(device_.empty() ? (dry_run_ ? "cuda" : default_device()) : device_);
    for (const auto& d : devices)
      if (d != "cpu" && d != "cuda") user_error("unknown --device '{}' (use cpu or cuda)", d);
    if (profile_ && std::find(devices.begin(), devices.end(), "cpu") != devices.end())
      user_error("--profile traces GPU kernels; it needs --device cuda");
    const auto precisions = split_list(precision_);
    for (const auto& p : precisions)
      if (p != "fp32" && p != "tf32" && p != "bf16") user_error("unknown --precision '{}' (use fp32, tf32 or bf16)", p);
    std::vector<AttentionKind> attentions;
    for (const auto& a : split_list(attention_)) attentions.push_back(parse_attention(a));
    std::vector<Recompute> recomputes;
    for (const auto& r : split_list(recompute_)) recomputes.push_back(parse_recompute(r));
    const auto accums = parse_positive_list("--grad-accum", grad_accum_);
    if (warmup_ < 0) user_error("--warmup must be non-negative, got {}", warmup_);
    if (steps_ <= 0) user_error("--steps must be positive, got {}", steps_);
    const ReportFormat format = parse_report_format(format_);
    const std::size_t limit = memory_limit_.empty() ? 0 : parse_memory_size("--memory-limit", memory_limit_);
    if (limit > 0 && !dry_run_) user_error("--memory-limit holds a dry run; add --dry-run");
    if (profile_ && dry_run_) user_error("--profile traces kernels, and a dry run runs none");
    if (!out_.empty()) write_file(out_, "");  // fail now, not after the sweep

    std::vector<BenchSpec> cells;
    for (const auto& m : models)
      for (const auto& d : devices)
        for (const auto& p : precisions)
          for (auto a : attentions)
            for (auto mode : modes)
              for (auto rc : recomputes)
                for (auto k : accums) {
                  // Only a backward accumulates: a mode without one runs once, as one micro-batch.
                  if (!has_backward(mode) && k != accums.front()) continue;
                  for (auto b : batches)
                    for (auto t : ctxs)
                      cells.push_back(BenchSpec{m, d, p, a, mode, b, t, warmup_, steps_, seed_, profile_, rc,
                                                has_backward(mode) ? static_cast<int>(k) : 1});
                }

    std::vector<MemorySpec> planned;
    for (const BenchSpec& s : cells) planned.push_back(MemorySpec{s, dry_run_, limit});
    warn_of_cells_that_cannot_fit(planned);  // a dry run's rows say it themselves

    SweepProgress shown;
    std::vector<BenchResult> rows;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const BenchSpec& s = cells[i];
      shown.start(fmt::format("[{}/{}] {}", i + 1, cells.size(), cell_label(planned[i])));
      auto progress = [&](int done, int total) { shown.step(done, total, done <= s.warmup ? " (warm-up)" : ""); };
      rows.push_back(dry_run_ ? dry_run_cell(planned[i]) : run_bench_cell(s, progress));
      shown.finish(rows.back().status);
      // Rewritten after every cell: an interrupted sweep keeps every row it finished.
      if (!out_.empty()) write_file(out_, format_bench(rows, format));
    }
    const std::string table = format_bench(rows, out_.empty() ? format : ReportFormat::markdown);
    fmt::print("{}", table);
    return 0;
  }

 private:
  ModelFlags model_;
  std::string ctx_ = "256", batch_ = "4", mode_ = "train", device_, precision_ = "fp32", attention_ = "flash",
              format_ = "md", out_, recompute_ = "none", grad_accum_ = "1";
  int warmup_ = 5, steps_ = 10;
  std::uint64_t seed_ = 0;
  bool profile_ = false, dry_run_ = false;
  std::string memory_limit_;

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
