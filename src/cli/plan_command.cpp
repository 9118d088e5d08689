// lmscope plan: for a memory budget, what fits before anything runs: per model, device, precision
// and attention, the peak and FLOPs per token at a reference shape and the largest context and
// batch whose step fits, all from dry runs (no GPU needed). With --recommend, per context instead:
// the fastest way (recompute mode, resident, kept or transient bf16 copies, micro-batches) to train
// --batch sequences per step that fits, timed on the device with --measure.
#include "commands.h"
#include "memory_flags.h"
#include "model_flags.h"
#include "sweep_output.h"

#include "lmscope/memory/plan.h"
#include "lmscope/memory/recommend.h"

namespace lmscope::cli {
namespace {

class PlanCommand : public Command {
 public:
  explicit PlanCommand(CLI::App& parent) {
    app = parent.add_subcommand("plan",
                                "What fits a memory budget, from dry runs: per model, precision and attention, the "
                                "largest context and batch whose step (--mode, default train) fits, and the peak at "
                                "a reference shape");
    std::string presets;
    for (const std::string& p : preset_names()) presets += (presets.empty() ? "" : ",") + p;
    cells_.set_default_models(presets);
    cells_.always_dry_run();
    cells_.precision = "fp32,tf32,bf16";
    cells_.attention = "naive,flash";
    cells_.add_to(*app);
    app->add_option("--ctx-multiple", ctx_multiple_, "The largest context is searched among multiples of this")
        ->capture_default_str();
    app->add_flag("--recommend", recommend_,
                  "Per model, precision, attention and context (--ctx takes a list here): the fastest recompute "
                  "mode, place of the bf16 weight copies and split of the --batch sequences into micro-batches "
                  "whose step fits");
    app->add_flag("--measure", measure_,
                  "With --recommend: time each candidate on the device (--measure-steps steps after the warm-up) "
                  "and name the fastest");
    app->add_option("--measure-steps", measure_steps_, "Measured steps per candidate with --measure")
        ->capture_default_str();
    app->add_option("--format", format_, "md, csv or json")->capture_default_str();
    app->add_option("--out", out_,
                    "Write the results here in --format, updated after every row (the Markdown table still prints)");
  }

  int run() override {
    // Checked whichever path runs: --measure-steps -1 without --recommend ran and said nothing.
    if (measure_steps_ < 1) user_error("--measure-steps must be at least 1, got {}", measure_steps_);
    if (ctx_multiple_ <= 0) user_error("--ctx-multiple must be positive, got {}", ctx_multiple_);
    if (ctx_multiple_ > kPlanMaxCtx)
      user_error("--ctx-multiple must be at most {}, got {}", kPlanMaxCtx, ctx_multiple_);
    if (measure_ && !recommend_) user_error("--measure times the candidates of --recommend; add --recommend");
    if (recommend_) return run_recommend();
    // --ctx, --batch and --mode name the reference shape: one each.
    for (auto [flag, value] :
         {std::pair{"--ctx", &cells_.ctx}, std::pair{"--batch", &cells_.batch}, std::pair{"--mode", &cells_.mode}})
      if (split_list(*value).size() != 1)
        user_error("plan takes one {} (the reference shape it searches from), got '{}'", flag, *value);
    const std::vector<MemorySpec> cells = cells_.resolve();
    const ReportFormat format = parse_report_format(format_);
    if (!out_.empty()) write_file(out_, "");  // fail now, not after the search

    SweepProgress shown;
    std::vector<PlanRow> rows;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const BenchSpec& c = cells[i].cell;
      shown.start(fmt::format("[{}/{}] {} {} {} {} {}", i + 1, cells.size(), c.model.name, c.device, c.precision,
                              attention_name(c.attention), c.label()));
      rows.push_back(plan_cell(PlanSpec{c, ctx_multiple_, cells[i].memory_limit}));
      const PlanRow& row = rows.back();
      shown.finish(row.reference_outcome == MemoryOutcome::failed
                       ? row.reference_status
                       : fmt::format("largest ctx {}, batch {}", row.largest_ctx, row.largest_batch));
      if (!out_.empty()) write_file(out_, format_plan(rows, format));
    }
    fmt::print("{}", format_plan(rows, out_.empty() ? format : ReportFormat::markdown));
    return 0;
  }

 private:
  int run_recommend() {
    if (split_list(cells_.batch).size() != 1)
      user_error("plan --recommend takes one --batch (the sequences of each step), got '{}'", cells_.batch);
    if (cells_.recompute != "none" || cells_.grad_accum != "1" || cells_.weight_copies != "kept")
      user_error("plan --recommend chooses --recompute, --grad-accum and --weight-copies itself; leave them out");
    const std::vector<MemorySpec> cells = cells_.resolve();
    for (const MemorySpec& m : cells)
      if (!has_backward(m.cell.mode))
        user_error("plan --recommend is for steps with a backward (--mode train or forward-backward), got {}",
                   step_mode_name(m.cell.mode));
    const ReportFormat format = parse_report_format(format_);
    if (!out_.empty()) write_file(out_, "");

    SweepProgress shown;
    std::vector<Recommendation> rows;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const BenchSpec& c = cells[i].cell;
      shown.start(fmt::format("[{}/{}] {} {} {} {} ctx {}, {} sequences per step", i + 1, cells.size(), c.model.name,
                              c.device, c.precision, attention_name(c.attention), c.ctx, c.batch));
      rows.push_back(recommend(RecommendSpec{c, cells[i].memory_limit, measure_, measure_steps_}));
      const Recommendation& r = rows.back();
      shown.finish(r.chosen < 0 ? (r.failure.empty() ? "nothing fits" : r.failure)
                                : fmt::format("{} candidate(s)", r.candidates.size()));
      if (!out_.empty()) write_file(out_, format_recommendations(rows, format));
    }
    fmt::print("{}", format_recommendations(rows, out_.empty() ? format : ReportFormat::markdown));
    return 0;
  }

  MemoryCellFlags cells_;
  bool recommend_ = false, measure_ = false;
  int measure_steps_ = 3;
  std::int64_t ctx_multiple_ = 128;
  std::string format_ = "md", out_;
};

}  // namespace

std::unique_ptr<Command> add_plan_command(CLI::App& parent) { return std::make_unique<PlanCommand>(parent); }

}  // namespace lmscope::cli
