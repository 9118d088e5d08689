// lmscope precision: mixed precision as the seeds study it. The accumulation experiment (one small
// number added a thousand times into sums of each format), and the dtype of every tensor a train
// step holds under each --precision, from the engine's own allocations (a dry run: no GPU needed).
#include "commands.h"
#include "model_flags.h"
#include "sweep_output.h"

#include "lmscope/bench/report.h"
#include "lmscope/core/error.h"
#include "lmscope/model/attention.h"
#include "lmscope/precision/accumulation.h"
#include "lmscope/precision/tensor_dtypes.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace lmscope::cli {
namespace {

// Why a sum came out as it did, from what the run saw.
std::string accumulation_why(const AccumulationResult& r, double addend, int count) {
  const NumberFormat& acc = *r.how.accumulator;
  const NumberFormat& add = *r.how.addend;
  if (!std::isfinite(r.addend_stored))
    return fmt::format("{} is past {}'s largest number ({:g}), so the addend is stored as infinity and so is the sum",
                       addend, add.name, add.max_finite);
  if (r.addend_stored == 0)
    return fmt::format(
        "{} is below half of {}'s smallest number ({:.4g}), so the addend is stored as 0 and adds "
        "nothing",
        addend, add.name, spacing_at(add, 0));
  std::string why = fmt::format("the addend is stored as {:.10g}, so {} of them make {:.10g} ({:+.4g})",
                                r.addend_stored, count, r.addend_stored * count, (r.addend_stored - addend) * count);
  if (!std::isfinite(r.sum))
    return why +
           fmt::format("; the sum passes {}'s largest number ({:g}) and becomes infinity", acc.name, acc.max_finite);
  if (r.stalled_at > 0)
    return why + fmt::format(
                     "; from addition {} on the sum stays at {:.6g}: there {}'s numbers are {:.4g} apart, and an "
                     "addend of at most half of that rounds away (a tie to the even neighbour)",
                     r.stalled_at, r.stalled_sum, acc.name, spacing_at(acc, r.stalled_sum));
  if (std::fabs(r.sum - r.addend_stored * count) > r.spacing)
    return why + fmt::format(
                     "; each addition rounds the sum to {}, whose numbers near {:.4g} are {:.4g} apart, and "
                     "those roundings add up to {:+.4g}",
                     acc.name, r.sum, r.spacing, r.sum - r.addend_stored * count);
  return why + "; the sum's own roundings stay below its spacing";
}

std::string accumulation_markdown(const std::vector<AccumulationResult>& results, double addend, int count) {
  std::string s = fmt::format("## Adding {} {} time{}\n\n", addend, count, count == 1 ? "" : "s");
  s += "| sum held in | addend stored in | addend as stored | sum | error | spacing of the sum's format there |\n";
  s += "|---|---|---:|---:|---:|---:|\n";
  for (const AccumulationResult& r : results)
    s += fmt::format("| {} | {} | {:.10g} | {:.10g} | {:+.4g} | {:.4g} |\n", r.how.accumulator->name,
                     r.how.addend->name, r.addend_stored, r.sum, r.sum - r.exact, r.spacing);
  s += "\nWhy:\n";
  for (const AccumulationResult& r : results)
    s += fmt::format("- {} sum, {} addend: {}.\n", r.how.accumulator->name, r.how.addend->name,
                     accumulation_why(r, addend, count));
  return s + "\n";
}

// JSON has no infinity: a number where there is one, its name ("inf", "-inf", "nan") otherwise.
nlohmann::ordered_json json_number(double x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf";
}

std::string dtypes_markdown(const std::vector<TensorDtypeRow>& rows, const std::vector<DtypeColumn>& columns,
                            const BenchSpec& cell) {
  std::vector<std::string> precisions;
  for (const DtypeColumn& c : columns) precisions.push_back(c.name());
  std::string s = fmt::format(
      "## The dtype of every tensor of a train step ({}, {} attention; from a dry run of the CUDA backend)\n\n",
      cell.model.name, attention_name(cell.attention));
  s += "| kind | tensor |";
  for (const std::string& p : precisions) s += fmt::format(" {} |", p);
  s += "\n|---|---|";
  for (std::size_t i = 0; i < precisions.size(); ++i) s += "---|";
  s += "\n";
  for (const TensorDtypeRow& r : rows) {
    s += fmt::format("| {} | `{}` |", r.kind, r.what);
    for (const std::string& p : precisions) {
      const auto it = r.dtype.find(p);
      s += fmt::format(" {} |", it == r.dtype.end() ? "-" : it->second);
    }
    s += "\n";
  }
  s += "\n(- : not held under that precision.";
  if (std::find(precisions.begin(), precisions.end(), "tf32") != precisions.end())
    s += " tf32 stores fp32; only the GEMMs round their inputs to tf32's 10 mantissa bits.";
  s += ")\n";
  return s;
}

class PrecisionCommand : public Command {
 public:
  explicit PrecisionCommand(CLI::App& parent) {
    app = parent.add_subcommand("precision",
                                "Mixed precision as the seeds study it: the accumulation experiment, and the dtype of "
                                "every tensor of a train step under each --precision");
    app->add_option("--study", study_, "accumulation, dtypes, or both (comma list)")->capture_default_str();
    app->add_option("--addend", addend_, "Accumulation: the number added")->capture_default_str();
    app->add_option("--count", count_, "Accumulation: how many times")->capture_default_str();
    model_.add_to(*app, false);
    app->add_option("--precision", precision_, "Dtypes: the precisions compared (comma list of fp32, tf32, bf16, fp16)")
        ->capture_default_str();
    app->add_option("--master-dtype", master_dtype_,
                    "Dtypes: the masters compared (comma list of fp32, bf16; bf16 masters under bf16 only)")
        ->capture_default_str();
    app->add_option("--attention", attention_, "Dtypes: flash or naive")->capture_default_str();
    app->add_option("--ctx", ctx_, "Dtypes: tokens per sequence of the step")->capture_default_str();
    app->add_option("--batch", batch_, "Dtypes: sequences of the step")->capture_default_str();
    app->add_option("--format", format_, "md or json")->capture_default_str();
    app->add_option("--out", out_, "Write the results here in --format (the Markdown still prints)");
  }

  int run() override {
    bool accumulation = false, dtypes = false;
    for (const std::string& s : split_list(study_)) {
      if (s == "accumulation")
        accumulation = true;
      else if (s == "dtypes")
        dtypes = true;
      else
        user_error("unknown --study '{}' (use accumulation, dtypes, or both)", s);
    }
    if (!(addend_ > 0) || !std::isfinite(addend_))
      user_error("--addend must be a positive, finite number, got {}", addend_);
    if (count_ <= 0 || count_ > 100'000'000) user_error("--count must be between 1 and 10^8, got {}", count_);
    const ReportFormat format = parse_report_format(format_);
    if (format == ReportFormat::csv) user_error("--format csv is not offered here (use md or json)");
    const std::vector<std::string> precisions = split_list(precision_);
    for (const std::string& p : precisions) check_precision(p);
    std::vector<DType> masters;
    for (const std::string& m : split_list(master_dtype_)) masters.push_back(parse_master_dtype(m));
    const std::vector<DtypeColumn> columns = dtype_columns(precisions, masters);
    if (ctx_ <= 0) user_error("--ctx must be positive, got {}", ctx_);
    if (batch_ <= 0) user_error("--batch must be positive, got {}", batch_);
    BenchSpec cell;
    cell.model = model_.resolve_one();
    cell.device = "cuda";
    cell.attention = parse_attention(attention_);
    cell.ctx = ctx_;
    cell.batch = batch_;
    if (!out_.empty()) write_file(out_, "");  // fail now if it cannot be written

    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    std::string md;
    if (accumulation) {
      std::vector<AccumulationResult> results;
      nlohmann::ordered_json rows = nlohmann::ordered_json::array();
      for (const AccumulationCase& c : accumulation_cases()) {
        results.push_back(accumulate(c, addend_, count_));
        const AccumulationResult& r = results.back();
        rows.push_back({{"accumulator", r.how.accumulator->name},
                        {"addend_format", r.how.addend->name},
                        {"addend_stored", json_number(r.addend_stored)},
                        {"sum", json_number(r.sum)},
                        {"exact", r.exact},
                        {"error", json_number(r.sum - r.exact)},
                        {"spacing_at_sum", json_number(r.spacing)},
                        {"stalled_at", r.stalled_at}});
      }
      j["accumulation"] = {{"addend", addend_}, {"count", count_}, {"results", rows}};
      md += accumulation_markdown(results, addend_, count_);
    }
    if (dtypes) {
      const std::vector<TensorDtypeRow> rows = tensor_dtypes(cell, columns);
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      for (const TensorDtypeRow& r : rows) list.push_back({{"kind", r.kind}, {"tensor", r.what}, {"dtype", r.dtype}});
      j["dtypes"] = {{"model", cell.model.name},
                     {"attention", attention_name(cell.attention)},
                     {"batch", batch_},
                     {"ctx", ctx_},
                     {"tensors", list}};
      md += dtypes_markdown(rows, columns, cell);
    }
    const std::string json = j.dump(2) + "\n";
    if (!out_.empty()) write_file(out_, format == ReportFormat::json ? json : md);
    fmt::print("{}", format == ReportFormat::json && out_.empty() ? json : md);
    return 0;
  }

 private:
  ModelFlags model_;
  std::string study_ = "accumulation,dtypes", precision_ = "fp32,tf32,bf16,fp16", master_dtype_ = "fp32",
              attention_ = "flash", format_ = "md", out_;
  double addend_ = 0.01;
  int count_ = 1000;
  std::int64_t ctx_ = 128, batch_ = 1;
};

}  // namespace

std::unique_ptr<Command> add_precision_command(CLI::App& parent) { return std::make_unique<PrecisionCommand>(parent); }

}  // namespace lmscope::cli
