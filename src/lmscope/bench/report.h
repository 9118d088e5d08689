// Benchmark rows as a Markdown table (for people), CSV (for spreadsheets and pandas) or JSON.
#pragma once

#include "lmscope/bench/attention_bench.h"
#include "lmscope/bench/runner.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace lmscope {

enum class ReportFormat { markdown, csv, json };
ReportFormat parse_report_format(const std::string& s);  // "md", "csv", "json"; throws UserError

// Rows in format f, by the writer for each format (every report has the three).
template <typename Rows, typename Markdown, typename Csv, typename Json>
std::string format_rows(const Rows& rows, ReportFormat f, Markdown markdown, Csv csv, Json json) {
  switch (f) {
    case ReportFormat::markdown:
      return markdown(rows);
    case ReportFormat::csv:
      return csv(rows);
    case ReportFormat::json:
      return json(rows);
  }
  return {};
}

// A CSV field, quoted when it holds a comma, quote or newline.
std::string csv_field(const std::string& s);

std::string format_bench(const std::vector<BenchResult>& rows, ReportFormat f);
std::string format_attention_bench(const std::vector<AttentionBenchResult>& rows, ReportFormat f);

}  // namespace lmscope
