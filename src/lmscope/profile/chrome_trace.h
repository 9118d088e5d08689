// bench --trace and train --trace: steps as a Chrome trace-event file (the JSON that ui.perfetto.dev
// and chrome://tracing open), laid out as PyTorch's profiler (Kineto) lays out its traces:
// - the host process: one thread's track with the ranges the runner and the model mark (each step,
//   its phases, each layer, each op), nested as they ran, and inside them the CUDA runtime and driver
//   calls made (cudaLaunchKernel, ...);
// - one process per GPU ("GPU 0") with a track per stream ("stream 7") holding every kernel, memset
//   and memcpy, and a flow arrow ("ac2g") from each launching call to the work it enqueued;
// - counter tracks with the allocator's bytes allocated and reserved after every event.
// Times are the allocator's clock in microseconds; device records share it (KernelRecord).
#pragma once

#include "lmscope/core/allocator.h"
#include "lmscope/core/ranges.h"
#include "lmscope/profile/kernel_profile.h"

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

struct TraceContents {
  std::vector<TraceRange> ranges;
  // The allocator's record over the same time, and its bytes at the first event.
  std::vector<MemEvent> events;
  std::size_t allocated_before = 0, reserved_before = 0;
  DeviceActivity device;              // empty where the backend has no tracer (CPU)
  std::uint64_t clock_origin_ns = 0;  // Allocator::clock_origin_ns: device times count from it
  TraceLabels labels;
};

// The trace-event JSON: metadata naming processes and threads, one complete event ("X") per range,
// call and device record, flow events from calls to their device work, and the counters.
std::string chrome_trace_json(const TraceContents& trace);

}  // namespace lmscope
