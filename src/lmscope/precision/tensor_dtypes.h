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
  std::map<std::string, std::string> dtype;  // precision -> "f32", "bf16", "f16", "i32"; "" where not held
};

// One dry-run train step of `cell` per precision (the cell's own precision ignored), rows in the
// order the tags first appear.
std::vector<TensorDtypeRow> tensor_dtypes(const BenchSpec& cell, const std::vector<std::string>& precisions);

}  // namespace lmscope
