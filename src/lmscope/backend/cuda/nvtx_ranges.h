// The ranges the model and the runner mark (step, phase, layer, op) as NVTX ranges in the "lmscope"
// domain, one NVTX category per level, so nsys and Nsight Compute show the structure bench --trace
// shows. NVTX reaches a tool only when one injected itself (NVTX_INJECTION64_PATH, set by nsys, ncu
// and CUPTI users); the CUDA backend installs this listener only then, so a run nobody profiles
// pays nothing.
#pragma once

#include "lmscope/core/ranges.h"

#include <memory>

namespace lmscope::cuda {

// Whether an NVTX tool will hear ranges in this process.
bool nvtx_tool_attached();
std::unique_ptr<RangeListener> make_nvtx_ranges();

}  // namespace lmscope::cuda
