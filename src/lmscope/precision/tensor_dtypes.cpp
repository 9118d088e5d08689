#include "lmscope/precision/tensor_dtypes.h"

#include "lmscope/core/error.h"
#include "lmscope/memory/memory_analysis.h"
#include "lmscope/memory/memory_run.h"

#include <set>

namespace lmscope {

std::vector<TensorDtypeRow> tensor_dtypes(const BenchSpec& cell, const std::vector<std::string>& precisions) {
  std::vector<TensorDtypeRow> rows;
  std::map<std::pair<std::string, std::string>, std::size_t> index;
  for (const std::string& precision : precisions) {
    MemorySpec spec{cell, true, 0};
    spec.cell.precision = precision;
    spec.cell.mode = StepMode::train;
    spec.cell.warmup = 1;  // the step as it repeats: what AdamW leaves for the next one included
    const MemoryRecord record = record_memory(spec);
    if (!record.has_step())
      user_error("the dry run of {} in {} did not run: {}", cell.model.name, precision, record.status);
    std::map<std::pair<std::string, std::string>, std::set<std::string>> dtypes;
    for (const MemEvent& e : record.events) {
      if (e.action != MemAction::alloc) continue;
      const std::pair key{std::string(mem_kind_name(e.tag.kind)), without_layer_number(e.tag.what)};
      if (!index.contains(key)) {
        index[key] = rows.size();
        rows.push_back({key.first, key.second, {}});
      }
      dtypes[key].insert(dtype_name(e.dtype));
    }
    for (auto& [key, names] : dtypes) {
      std::string joined;
      for (const std::string& n : names) joined += (joined.empty() ? "" : "/") + n;
      TensorDtypeRow& row = rows[index[key]];
      row.dtype[precision] = joined;
    }
  }
  return rows;
}

}  // namespace lmscope
