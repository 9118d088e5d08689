// The dtype of every tensor a train step holds, under each --precision, read from the engine's own
// allocations: a dry run of one step (the shape-only backend standing for the GPU) records every
// buffer with its tag and dtype, and the tags are the model's own names. It answers the seeds'
// autocast question (which tensors are bf16, which stay fp32) for lmscope's mixed precision.
#pragma once

#include "lmscope/bench/runner.h"

#include <map>
#include <string>
#include <vector>

namespace lmscope {

struct TensorDtypeRow {
  std::string kind;                          // parameter, gradient, optimizer_state, activation, workspace, input
  std::string what;                          // the tag, with layer numbers written as {i}
  std::map<std::string, std::string> dtype;  // column -> "f32", "bf16", "f16", "i32"; absent where not held
};

// A column of the table: a precision, with fp32 or bf16 masters (--master-dtype).
struct DtypeColumn {
  std::string precision;
  DType masters = DType::f32;
  // "bf16", or "bf16, bf16 masters".
  std::string name() const;
};
// Every precision with fp32 masters, and with bf16 masters where they run (under bf16), in the
// precisions' order; UserError when bf16 masters are asked for and no precision is bf16.
std::vector<DtypeColumn> dtype_columns(const std::vector<std::string>& precisions, const std::vector<DType>& masters);

// One dry-run train step of `cell` per column (the cell's own precision and masters ignored), rows
// in the order the tags first appear.
std::vector<TensorDtypeRow> tensor_dtypes(const BenchSpec& cell, const std::vector<DtypeColumn>& columns);

}  // namespace lmscope
