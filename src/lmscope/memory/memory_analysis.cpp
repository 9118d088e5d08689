#include "lmscope/memory/memory_analysis.h"

#include "lmscope/device/device_facts.h"

#include <algorithm>
#include <map>

namespace lmscope {

std::string buffer_name(const AllocTag& tag) {
  std::string name = tag.what;
  if (tag.layer >= 0 && name.rfind("layers.", 0) != 0 && name.find(".layers.") == std::string::npos)
    name = fmt::format("layers.{}.{}", tag.layer, name);
  if (tag.kind == MemKind::gradient) name += ".grad";
  return name;
}

std::string source_path(const char* file) {
  if (!file) return "?";
  const std::string f(file);
  const std::size_t at = f.rfind("src/lmscope/");
  return at == std::string::npos ? f : f.substr(at);
}

std::string buffer_source(const AllocTag& tag) { return fmt::format("{}:{}", source_path(tag.file), tag.line); }

std::string without_layer_number(std::string name) {
  if (const std::size_t at = name.find("layers."); at != std::string::npos) {
    const std::size_t dot = name.find('.', at + 7);
    if (dot != std::string::npos) name = name.substr(0, at) + "layers.{i}" + name.substr(dot);
  }
  return name;
}

std::string op_name(const AllocTag& tag) {
  std::string name = without_layer_number(tag.what);
  if (tag.kind == MemKind::gradient) name += ".grad";
  return name;
}

MemoryReplay::Segment* MemoryReplay::segment_of(std::uintptr_t address) {
  auto it = segment_at_.upper_bound(address);
  if (it == segment_at_.begin()) return nullptr;
  Segment& s = segments_.at(std::prev(it)->second);
  return address < s.address + s.bytes ? &s : nullptr;
}

void MemoryReplay::apply(const MemEvent& e) {
  switch (e.action) {
    case MemAction::alloc: {
      const LiveBuffer b{e.tag, e.shape, e.dtype, e.bytes, e.address, e.phase};
      LMSCOPE_CHECK(live_at_.emplace(e.address, next_).second, "{:#x} allocated twice", e.address);
      live_.emplace(next_++, b);
      allocated_ += e.bytes;
      by_kind_[static_cast<int>(e.tag.kind)] += e.bytes;
      if (Segment* s = segment_of(e.address)) {  // records of one block per buffer have no segments
        LMSCOPE_CHECK(e.address + e.bytes <= s->address + s->bytes, "{:#x} runs past its segment", e.address);
        if (s->live.empty() && e.address == s->address) s->small = e.bytes < Allocator::kSmallRequest;
        s->live.emplace(e.address, b);
      }
      break;
    }
    case MemAction::free: {
      auto at = live_at_.find(e.address);
      LMSCOPE_CHECK(at != live_at_.end(), "a free of {:#x} that was never allocated", e.address);
      auto it = live_.find(at->second);
      allocated_ -= it->second.bytes;
      by_kind_[static_cast<int>(it->second.tag.kind)] -= it->second.bytes;
      live_.erase(it);
      live_at_.erase(at);
      if (Segment* s = segment_of(e.address)) s->live.erase(e.address);
      break;
    }
    case MemAction::segment_alloc:
      LMSCOPE_CHECK(segment_of(e.address) == nullptr, "segment {:#x} made twice", e.address);
      segment_at_.emplace(e.address, next_);
      segments_.emplace(next_++, Segment{e.address, e.bytes, false, {}});
      reserved_ += e.bytes;
      paged_ += driver_segment_bytes(e.bytes);
      break;
    case MemAction::segment_free: {
      auto at = segment_at_.find(e.address);
      LMSCOPE_CHECK(at != segment_at_.end() && segments_.at(at->second).live.empty(),
                    "a segment freed at {:#x} that is not free", e.address);
      reserved_ -= segments_.at(at->second).bytes;
      paged_ -= driver_segment_bytes(segments_.at(at->second).bytes);
      segments_.erase(at->second);
      segment_at_.erase(at);
      break;
    }
    case MemAction::oom:
      break;
  }
}

std::vector<LiveBuffer> MemoryReplay::live() const {
  std::vector<LiveBuffer> out;
  for (const auto& [seq, b] : live_) out.push_back(b);
  return out;
}

std::vector<MemoryReplay::Segment> MemoryReplay::segments() const {
  std::vector<Segment> out;
  for (const auto& [seq, s] : segments_) out.push_back(s);
  return out;
}

// Two passes: the numbers of every moment first, then the live set at the peak alone.
MemoryAnalysis analyze_memory(const MemoryRecord& record, int top) {
  MemoryAnalysis a;
  MemoryReplay replay;
  const std::vector<MemEvent>& events = record.events;
  const std::size_t begin = std::min(record.step_begin, events.size());
  const bool cuda_pages = record.spec.cell.device == "cuda";
  auto on_device = [&] { return cuda_pages ? replay.reserved_in_pages() : replay.reserved(); };
  for (std::size_t i = 0; i < begin; ++i) {
    replay.apply(events[i]);
    a.peak_segments_on_device = std::max(a.peak_segments_on_device, on_device());
  }
  a.at_step_start = a.peak = replay.allocated();
  a.peak_reserved = a.reserved_at_peak = replay.reserved();
  a.peak_at_start = true;
  a.peak_event = begin;
  // The phases by where they begin: forward with the step, then backward and the optimizer where
  // the mode has them (a forward's dropped activations end the forward).
  auto phase_at = [&](std::size_t i) {
    if (record.optimizer_begin && i >= *record.optimizer_begin) return Phase::optimizer;
    if (record.backward_begin && i >= *record.backward_begin) return Phase::backward;
    return Phase::forward;
  };
  auto mark = [&](Phase p, std::size_t bytes) {
    auto& peak = a.phase_peak[static_cast<int>(p)];
    peak = std::max(peak.value_or(0), bytes);
  };
  mark(Phase::forward, replay.allocated());
  if (record.backward_begin && *record.backward_begin == begin) mark(Phase::backward, replay.allocated());
  for (std::size_t i = begin; i < events.size(); ++i) {
    const MemEvent& e = events[i];
    const Phase phase = phase_at(i);
    if (record.backward_begin && i == *record.backward_begin) {
      a.held_at_backward = replay.allocated();
      mark(Phase::backward, replay.allocated());
    }
    if (record.optimizer_begin && i == *record.optimizer_begin) {
      a.held_at_optimizer = replay.allocated();
      mark(Phase::optimizer, replay.allocated());
    }
    replay.apply(e);
    mark(phase, replay.allocated());
    a.peak_reserved = std::max(a.peak_reserved, replay.reserved());
    a.peak_segments_on_device = std::max(a.peak_segments_on_device, on_device());
    if (replay.allocated() > a.peak) {
      a.peak = replay.allocated();
      a.peak_event = i;
      a.peak_at_start = false;
      a.peak_phase = phase;
      a.peak_tag = e.tag;
      a.reserved_at_peak = replay.reserved();
    }
  }
  // A phase with no event of its own holds what it began with.
  if (record.backward_begin && *record.backward_begin >= events.size()) {
    a.held_at_backward = replay.allocated();
    mark(Phase::backward, replay.allocated());
  }
  if (record.optimizer_begin && *record.optimizer_begin >= events.size()) {
    a.held_at_optimizer = replay.allocated();
    mark(Phase::optimizer, replay.allocated());
  }
  a.at_step_end = replay.allocated();
  a.reserved_at_step_end = replay.reserved();
  a.paged_at_step_end = replay.reserved_in_pages();

  MemoryReplay at_peak;
  for (std::size_t i = 0; i < (a.peak_at_start ? begin : a.peak_event + 1); ++i) at_peak.apply(events[i]);
  for (int k = 0; k < kMemKinds; ++k) a.peak_by_kind[k] = at_peak.allocated(static_cast<MemKind>(k));
  std::map<std::string, std::size_t> by_op;
  a.top = at_peak.live();
  for (const LiveBuffer& b : a.top) by_op[op_name(b.tag)] += b.bytes;
  a.peak_by_op.assign(by_op.begin(), by_op.end());
  std::stable_sort(a.peak_by_op.begin(), a.peak_by_op.end(),
                   [](const auto& x, const auto& y) { return x.second > y.second; });
  a.live_at_peak = a.top.size();
  std::stable_sort(a.top.begin(), a.top.end(),
                   [](const LiveBuffer& x, const LiveBuffer& y) { return x.bytes > y.bytes; });
  a.top.resize(std::min<std::size_t>(a.top.size(), static_cast<std::size_t>(std::max(top, 1))));
  return a;
}

std::size_t device_need(const MemoryRecord& record, const MemoryAnalysis& analysis) {
  return (record.device ? record.device->used_at_start : 0) + analysis.peak_segments_on_device;
}

std::size_t device_limit(const MemoryRecord& record) { return record.device ? record.device->total : record.capacity; }

}  // namespace lmscope
