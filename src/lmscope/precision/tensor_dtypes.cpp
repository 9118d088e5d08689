#include "lmscope/precision/tensor_dtypes.h"

#include "lmscope/core/error.h"
#include "lmscope/memory/memory_analysis.h"
#include "lmscope/memory/memory_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace lmscope {

std::string DtypeColumn::name() const {
  return masters == DType::f32 ? precision : fmt::format("{}, {} masters", precision, master_dtype_name(masters));
}

std::vector<DtypeColumn> dtype_columns(const std::vector<std::string>& precisions, const std::vector<DType>& masters) {
  std::vector<DtypeColumn> columns;
  for (const std::string& p : precisions)
    for (DType m : masters)
      if (m == DType::f32 || p == "bf16") columns.push_back({p, m});
  if (columns.empty() || (std::ranges::count(masters, DType::bf16) > 0 &&
                          std::ranges::none_of(columns, [](const DtypeColumn& c) { return c.masters == DType::bf16; })))
    user_error("--master-dtype bf16 needs bf16 among --precision");
  return columns;
}

std::vector<TensorDtypeRow> tensor_dtypes(const BenchSpec& cell, const std::vector<DtypeColumn>& columns) {
  std::vector<TensorDtypeRow> rows;
  std::map<std::pair<std::string, std::string>, std::size_t> index;
  for (const DtypeColumn& column : columns) {
    const std::string precision = column.name();
    MemorySpec spec{cell, true, 0};
    spec.cell.precision = column.precision;
    spec.cell.master_dtype = column.masters;
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
