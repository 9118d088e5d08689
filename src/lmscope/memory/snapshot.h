// One memory record as the pickle torch.cuda.memory._dump_snapshot writes, which PyTorch's viewer
// (pytorch.org/memory_viz, MemoryViz.js) opens: {"segments": the allocator's segments and blocks at
// the end of the step, "device_traces": [the step's trace]}. Each buffer's frame names what
// lmscope knows of it (layers.7.ffn.w1_out, its kind, dtype and shape, the phase, the line of the
// model code that asked for it) where PyTorch shows a stack trace. Pickle protocol 2, and only the
// opcodes the viewer's own unpickler reads: dicts, lists, strings, ints, floats, bools, None.
#pragma once

#include "lmscope/memory/memory_run.h"

#include <string>

namespace lmscope {

std::string memory_snapshot_pickle(const MemoryRecord& record);

}  // namespace lmscope
