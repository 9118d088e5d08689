#include "lmscope/profile/chrome_trace.h"

#include "lmscope/core/error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace lmscope {

void TraceRecorder::begin(RangeLevel level, const char* name, int index) {
  const double now = clock_.now_us();
  open_.push_back(ranges_.size());
  ranges_.push_back({level, index >= 0 ? fmt::format("{} {}", name, index) : std::string(name), now, now});
}

void TraceRecorder::end() {
  LMSCOPE_CHECK(!open_.empty(), "a range ended that never began");
  ranges_[open_.back()].end_us = clock_.now_us();
  open_.pop_back();
}

std::string chrome_trace_json(const std::vector<TraceRange>& ranges, const std::vector<MemEvent>& events,
                              std::size_t allocated_before, std::size_t reserved_before, const TraceLabels& labels) {
  using nlohmann::ordered_json;
  constexpr int kPid = 1, kHostTid = 1;
  ordered_json trace = ordered_json::array();
  trace.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", kPid}, {"args", {{"name", labels.process}}}});
  trace.push_back(
      {{"name", "thread_name"}, {"ph", "M"}, {"pid", kPid}, {"tid", kHostTid}, {"args", {{"name", labels.thread}}}});
  for (const TraceRange& r : ranges)
    trace.push_back({{"name", r.name},
                     {"cat", range_level_name(r.level)},
                     {"ph", "X"},
                     {"pid", kPid},
                     {"tid", kHostTid},
                     {"ts", r.start_us},
                     {"dur", r.end_us - r.start_us}});
  // Counters: the bytes after each event, as the allocator counts them.
  std::size_t allocated = allocated_before, reserved = reserved_before;
  auto counter = [&](const char* name, double ts, std::size_t bytes) {
    trace.push_back({{"name", name}, {"ph", "C"}, {"pid", kPid}, {"ts", ts}, {"args", {{"bytes", bytes}}}});
  };
  if (!events.empty()) {
    counter("allocated", events.front().time_us, allocated);
    counter("reserved", events.front().time_us, reserved);
  }
  for (const MemEvent& e : events) {
    switch (e.action) {
      case MemAction::alloc:
        allocated += e.bytes;
        break;
      case MemAction::free:
        allocated -= e.bytes;
        break;
      case MemAction::segment_alloc:
        reserved += e.bytes;
        break;
      case MemAction::segment_free:
        reserved -= e.bytes;
        break;
      case MemAction::oom:
        continue;
    }
    const bool segment = e.action == MemAction::segment_alloc || e.action == MemAction::segment_free;
    counter(segment ? "reserved" : "allocated", e.time_us, segment ? reserved : allocated);
  }
  ordered_json doc{{"traceEvents", trace}, {"displayTimeUnit", "ms"}};
  return doc.dump(1) + "\n";
}

}  // namespace lmscope
