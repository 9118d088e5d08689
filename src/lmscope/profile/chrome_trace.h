// bench --trace: the measured steps as a Chrome trace-event file (the JSON that ui.perfetto.dev and
// chrome://tracing open). The host thread's track holds the ranges the runner and the model mark
// (each step, its phases, each layer, each op), nested as they ran; counter tracks hold the
// allocator's bytes allocated and reserved after every event. Times are the allocator's clock, in
// microseconds, so ranges and memory line up. GPU kernels are not in it yet.
#pragma once

#include "lmscope/core/allocator.h"
#include "lmscope/core/ranges.h"

#include <string>
#include <vector>

namespace lmscope {

struct TraceRange {
  RangeLevel level = RangeLevel::op;
  std::string name;
  double start_us = 0, end_us = 0;
};

// Records ranges from the moment it is made; install it with Backend::set_range_listener.
class TraceRecorder final : public RangeListener {
 public:
  explicit TraceRecorder(const Allocator& clock) : clock_(clock) {}
  void begin(RangeLevel level, const char* name, int index) override;
  void end() override;
  // Every closed range, in the order each began.
  const std::vector<TraceRange>& ranges() const { return ranges_; }
  bool all_closed() const { return open_.empty(); }

 private:
  const Allocator& clock_;
  std::vector<TraceRange> ranges_;
  std::vector<std::size_t> open_;  // indices into ranges_
};

struct TraceLabels {
  std::string process;  // "lmscope bench: small ctx 256 ..."
  std::string thread = "host";
};

// The trace-event JSON: metadata naming the process and thread, one complete event ("X") per range,
// and the counters from `events` (the allocator's record over the same time) starting from
// `allocated_before` and `reserved_before`, the bytes at the first event.
std::string chrome_trace_json(const std::vector<TraceRange>& ranges, const std::vector<MemEvent>& events,
                              std::size_t allocated_before, std::size_t reserved_before, const TraceLabels& labels);

}  // namespace lmscope
