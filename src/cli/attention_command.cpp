// lmscope attention: the attention benchmarks of the seeds and the assignment, naive against
// flash. --suite seeds: batch 8, one head, d 16..128 × seq 256..16384 (forward, memory held before
// backward, backward); --suite scaling: batch 1, causal, seq 128..65536 × d 16..128 (forward,
// backward, forward+backward). Any list flag overrides the suite's.
#include "commands.h"
#include "model_flags.h"
#include "sweep_output.h"

#include "lmscope/backend/backend.h"
#include "lmscope/bench/report.h"

#include <optional>

namespace lmscope::cli {
namespace {

struct Suite {
  std::string batch, seq, d;
};

Suite suite_named(const std::string& name) {
  if (name == "seeds") return {"8", "256,1024,4096,8192,16384", "16,32,64,128"};
  if (name == "scaling") return {"1", "128,256,512,1024,2048,4096,8192,16384,32768,65536", "16,32,64,128"};
  user_error("unknown --suite '{}' (use seeds or scaling)", name);
}

class AttentionCommand : public Command {
 public:
  explicit AttentionCommand(CLI::App& parent) {
    app = parent.add_subcommand("attention", "Benchmark naive against flash attention (the seeds' attention sweeps)");
    app->add_option("--suite", suite_, "seeds (batch 8, seq to 16384) or scaling (batch 1, seq to 65536)")
        ->capture_default_str();
    app->add_option("--attention", kinds_, "naive, flash or both (comma list)")->capture_default_str();
    app->add_option("--precision", precisions_, "fp32, bf16, fp16 (comma list)")->capture_default_str();
    app->add_option("--batch", batch_, "Batch size(s) (default: the suite's)");
    app->add_option("--heads", heads_, "Heads per sequence (the seeds use none: 1)")->capture_default_str();
    app->add_option("--seq", seq_, "Sequence length(s) (default: the suite's)");
    app->add_option("--d", d_, "Head dimension(s) (default: the suite's)");
    app->add_option("--causal", causal_, "Causal mask: true or false")->capture_default_str();
    auto* deterministic =
        app->add_flag("--deterministic", deterministic_,
                      "Flash backward sums dq in a fixed order, by its own pass, so runs repeat bit for bit "
                      "(default: whichever of this and --atomic-dq is faster for the cell; the csv says which ran)");
    app->add_flag("--atomic-dq", atomic_dq_,
                  "Flash backward accumulates dq in fp32 in the dK/dV pass, by atomics or bulk reductions, in an "
                  "order that varies from run to run")
        ->excludes(deterministic);
    app->add_option("--warmup", warmup_, "Untimed passes before each timed phase")->capture_default_str();
    app->add_option("--iters", iters_, "Timed passes per phase")->capture_default_str();
    app->add_option("--max-seconds", max_seconds_, "Stop a phase early after this much timed work (at least 3 passes)")
        ->capture_default_str();
    app->add_option("--device", device_, "cpu or cuda (default: cuda when a GPU is visible)");
    app->add_option("--format", format_, "md, csv or json")->capture_default_str();
    app->add_option("--out", out_, "Write the results here in --format, updated after every cell");
    app->add_option("--seed", seed_, "Seed for q, k, v and dO")->capture_default_str();
  }

  int run() override {
    const Suite suite = suite_named(suite_);
    const auto batches = parse_positive_list("--batch", batch_.value_or(suite.batch));
    const auto seqs = parse_positive_list("--seq", seq_.value_or(suite.seq));
    const auto dims = parse_positive_list("--d", d_.value_or(suite.d));
    std::vector<AttentionKind> kinds;
    for (const auto& k : split_list(kinds_)) kinds.push_back(parse_attention(k));
    const auto precisions = split_list(precisions_);
    for (const auto& p : precisions) check_attention_precision(p);
    if (heads_ <= 0) user_error("--heads must be positive, got {}", heads_);
    if (warmup_ < 0) user_error("--warmup must be non-negative, got {}", warmup_);
    if (iters_ <= 0) user_error("--iters must be positive, got {}", iters_);
    if (!(max_seconds_ > 0)) user_error("--max-seconds must be positive, got {}", max_seconds_);
    const std::string device = device_.empty() ? default_device() : device_;
    if (device != "cpu" && device != "cuda") user_error("unknown --device '{}' (use cpu or cuda)", device);
    const ReportFormat format = parse_report_format(format_);
    if (!out_.empty()) write_file(out_, "");

    std::vector<AttentionBenchSpec> cells;
    for (const auto& p : precisions)
      for (auto d : dims)
        for (auto b : batches)
          for (auto t : seqs)
            for (auto k : kinds)
              cells.push_back({.kind = k,
                               .device = device,
                               .precision = p,
                               .batch = b,
                               .heads = heads_,
                               .seq = t,
                               .d = d,
                               .causal = causal_,
                               .dq = deterministic_ ? FlashDq::deterministic
                                     : atomic_dq_   ? FlashDq::atomic
                                                    : FlashDq::fastest,
                               .warmup = warmup_,
                               .iters = iters_,
                               .max_seconds = max_seconds_,
                               .seed = seed_});
    for (const AttentionBenchSpec& s : cells) validate_attention_cell(s);  // before any cell runs
    SweepProgress shown;
    std::vector<AttentionBenchResult> rows;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const AttentionBenchSpec& s = cells[i];
      shown.start(fmt::format("[{}/{}] {} {} batch·heads {} seq {} d {}", i + 1, cells.size(), attention_name(s.kind),
                              s.precision, s.batch * s.heads, s.seq, s.d));
      rows.push_back(run_attention_cell(s, [&](int done, int total) { shown.step(done, total, " passes"); }));
      shown.finish(rows.back().status);
      if (!out_.empty()) write_file(out_, format_attention_bench(rows, format));
    }
    fmt::print("{}", format_attention_bench(rows, out_.empty() ? format : ReportFormat::markdown));
    return 0;
  }

 private:
  std::string suite_ = "seeds", kinds_ = "naive,flash", precisions_ = "fp32,bf16", device_, format_ = "md", out_;
  std::optional<std::string> batch_, seq_, d_;
  std::int64_t heads_ = 1;
  bool causal_ = true, deterministic_ = false, atomic_dq_ = false;
  int warmup_ = 10, iters_ = 100;
  double max_seconds_ = 10;
  std::uint64_t seed_ = 0;
};

}  // namespace

std::unique_ptr<Command> add_attention_command(CLI::App& parent) { return std::make_unique<AttentionCommand>(parent); }

}  // namespace lmscope::cli
