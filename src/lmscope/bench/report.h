// Benchmark rows as a Markdown table (for people), CSV (for spreadsheets and pandas) or JSON.
#pragma once

#include "lmscope/bench/attention_bench.h"
#include "lmscope/bench/runner.h"

#include <string>
#include <vector>

namespace lmscope {

enum class ReportFormat { markdown, csv, json };
ReportFormat parse_report_format(const std::string& s);  // "md", "csv", "json"; throws UserError

std::string format_bench(const std::vector<BenchResult>& rows, ReportFormat f);
std::string format_attention_bench(const std::vector<AttentionBenchResult>& rows, ReportFormat f);

}  // namespace lmscope
