// Memory cells as a Markdown report (a summary table, then per cell the peak's breakdown by kind
// and by op, the largest live buffers and the whole device), CSV (one row per cell) or JSON.
#pragma once

#include "lmscope/bench/report.h"
#include "lmscope/memory/memory_analysis.h"

#include <string>
#include <vector>

namespace lmscope {

struct MemoryRow {
  MemoryRecord record;  // its events are not written
  MemoryAnalysis analysis;
  bool recorded = false;  // the analysis has a whole step to read (ok, or a dry run that does not fit)
};
MemoryRow memory_row(MemoryRecord record, int top);  // analyses a record, dropping its events

std::string format_memory(const std::vector<MemoryRow>& rows, ReportFormat f);

}  // namespace lmscope
