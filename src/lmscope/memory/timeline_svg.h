// The active-memory timeline of one recorded step as an SVG: allocated bytes after each allocation
// event, stacked by kind (parameters, gradients, optimizer state, inputs, workspace, activations)
// or, by layer, with each layer's activations in its own band; the phases shaded and named, the
// peak marked with what reached it. Plain SVG 1.1 that any browser draws.
#pragma once

#include "lmscope/memory/memory_analysis.h"

#include <string>

namespace lmscope {

enum class TimelineStack { kind, layer };
// The colour each kind has in the timeline (#rrggbb), for pictures that should match it.
const char* mem_kind_colour(MemKind k);
std::string memory_timeline_svg(const MemoryRecord& record, const MemoryAnalysis& analysis, TimelineStack stack);

}  // namespace lmscope
