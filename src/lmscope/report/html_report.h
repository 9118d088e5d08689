// lmscope report: one self-contained HTML page (inline SVG, inline style, no scripts) from the
// result files of bench, memory and attention: the seeds' tables, step time against context and
// model size, where a step's time goes by phase (and by kernel category with --profile), memory at
// the peak by kind and its timelines, attention time and memory against sequence length with the
// cells that ran out of memory marked, and training runs' loss curves side by side (fp16 against
// bf16 against fp32, say).
#pragma once

#include "lmscope/report/result_files.h"

#include <string>
#include <utility>
#include <vector>

namespace lmscope::report {

template <typename Row>
struct Named {
  std::string file;  // where the rows came from, as given
  std::vector<Row> rows;
};

struct ReportInputs {
  std::string title = "lmscope report";
  std::vector<Named<BenchRow>> bench;
  std::vector<Named<MemoryRow>> memory;
  std::vector<Named<AttentionRow>> attention;
  std::vector<Named<TrainStep>> train;                         // one training log each
  std::vector<std::pair<std::string, std::string>> timelines;  // (file, its SVG): lmscope memory --svg
};

std::string html_report(const ReportInputs& in);

}  // namespace lmscope::report
