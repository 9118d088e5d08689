#include "lmscope/profile/chrome_trace.h"

#include "lmscope/core/error.h"

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <map>
#include <set>
#include <utility>

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

namespace {

using nlohmann::ordered_json;

const char* work_category(DeviceWork w) {
  switch (w) {
    case DeviceWork::kernel:
      return "kernel";
    case DeviceWork::memset:
      return "gpu_memset";
    case DeviceWork::memcpy:
      return "gpu_memcpy";
  }
  return "kernel";
}

// The GPU's work: its processes and stream tracks, an event per record, and a flow from each
// launching call on the host track to the work it enqueued. Each flow has an id of its own, not the
// call's correlation id: one call may enqueue many kernels (a CUDA graph's launch), and a viewer
// ends a flow at the first head with its id.
void add_device_activity(ordered_json& trace, const TraceContents& t, int host_pid, int host_tid) {
  // Differences in integers first: exact, and a time before the origin comes out negative.
  auto us = [&](std::uint64_t ns) {
    return static_cast<double>(static_cast<std::int64_t>(ns - t.clock_origin_ns)) / 1e3;
  };
  auto duration_us = [](std::uint64_t from, std::uint64_t to) {
    return static_cast<double>(static_cast<std::int64_t>(to - from)) / 1e3;
  };
  std::set<std::uint32_t> devices;
  std::set<std::pair<std::uint32_t, std::uint32_t>> streams;
  for (const KernelRecord& r : t.device.work) {
    devices.insert(r.device);
    streams.insert({r.device, r.stream});
  }
  for (std::uint32_t d : devices) {
    const int pid = static_cast<int>(d);
    trace.push_back(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", fmt::format("GPU {}", d)}}}});
    trace.push_back(
        {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", 5000000 + pid}}}});
  }
  for (auto [d, stream] : streams)
    trace.push_back({{"name", "thread_name"},
                     {"ph", "M"},
                     {"pid", d},
                     {"tid", stream},
                     {"args", {{"name", fmt::format("stream {}", stream)}}}});

  std::map<std::uint32_t, std::uint64_t> launch_ns;  // correlation id -> the call's start
  for (const LaunchRecord& l : t.device.launches) launch_ns[l.correlation] = l.start_ns;
  std::uint64_t flows = 0;
  for (const KernelRecord& r : t.device.work) {
    if (r.start_ns == 0 && r.end_ns == 0) continue;  // CUPTI's mark for times it could not take
    ordered_json args{
        {"device", r.device}, {"stream", r.stream}, {"correlation", r.correlation}, {"phase", phase_name(r.phase)}};
    if (r.work == DeviceWork::kernel) {
      args["category"] = kernel_category(r.name);
      args["grid"] = {r.grid[0], r.grid[1], r.grid[2]};
      args["block"] = {r.block[0], r.block[1], r.block[2]};
      args["registers per thread"] = r.registers;
      args["shared memory"] = r.shared_bytes;
    } else {
      args["bytes"] = r.bytes;
      if (r.work == DeviceWork::memcpy) args["kind"] = r.copy;
    }
    trace.push_back({{"name", r.name},
                     {"cat", work_category(r.work)},
                     {"ph", "X"},
                     {"pid", r.device},
                     {"tid", r.stream},
                     {"ts", us(r.start_ns)},
                     {"dur", duration_us(r.start_ns, r.end_ns)},
                     {"args", std::move(args)}});
    const auto launch = launch_ns.find(r.correlation);
    if (launch == launch_ns.end()) continue;
    // The arrow's tail binds to the call's slice on the host track, its head to the slice that
    // encloses its time on the stream's track.
    ++flows;
    trace.push_back({{"name", "ac2g"},
                     {"cat", "ac2g"},
                     {"ph", "s"},
                     {"id", flows},
                     {"pid", host_pid},
                     {"tid", host_tid},
                     {"ts", us(launch->second)}});
    trace.push_back({{"name", "ac2g"},
                     {"cat", "ac2g"},
                     {"ph", "f"},
                     {"bp", "e"},
                     {"id", flows},
                     {"pid", r.device},
                     {"tid", r.stream},
                     {"ts", us(r.start_ns)}});
  }
  for (const LaunchRecord& l : t.device.launches) {
    trace.push_back({{"name", l.api},
                     {"cat", l.driver ? "cuda_driver" : "cuda_runtime"},
                     {"ph", "X"},
                     {"pid", host_pid},
                     {"tid", host_tid},
                     {"ts", us(l.start_ns)},
                     {"dur", duration_us(l.start_ns, l.end_ns)},
                     {"args", {{"correlation", l.correlation}}}});
  }
}

}  // namespace

std::string chrome_trace_json(const TraceContents& t) {
  // As Kineto does: the host's process id, and its main thread's id (the same number on Linux).
  const int pid = static_cast<int>(::getpid()), tid = pid;
  ordered_json trace = ordered_json::array();
  trace.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", t.labels.process}}}});
  trace.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", 0}}}});
  trace.push_back(
      {{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", t.labels.thread}}}});
  for (const TraceRange& r : t.ranges)
    trace.push_back({{"name", r.name},
                     {"cat", range_level_name(r.level)},
                     {"ph", "X"},
                     {"pid", pid},
                     {"tid", tid},
                     {"ts", r.start_us},
                     {"dur", r.end_us - r.start_us}});
  add_device_activity(trace, t, pid, tid);
  // Counters: the bytes after each event, as the allocator counts them.
  std::size_t allocated = t.allocated_before, reserved = t.reserved_before;
  auto counter = [&](const char* name, double ts, std::size_t bytes) {
    trace.push_back({{"name", name}, {"ph", "C"}, {"pid", pid}, {"ts", ts}, {"args", {{"bytes", bytes}}}});
  };
  if (!t.events.empty()) {
    counter("allocated", t.events.front().time_us, allocated);
    counter("reserved", t.events.front().time_us, reserved);
  }
  for (const MemEvent& e : t.events) {
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
