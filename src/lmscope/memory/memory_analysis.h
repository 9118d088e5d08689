// What a memory record says: the peak and its moment, what is live then (by kind, by op, the
// largest buffers), each phase's peak, what is held when the backward starts, and the whole
// device beside the allocator. Everything is replayed from the record's events.
#pragma once

#include "lmscope/memory/memory_run.h"

#include <array>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace lmscope {

struct LiveBuffer {
  AllocTag tag;
  Shape shape;
  DType dtype = DType::f32;
  std::size_t bytes = 0;
  std::uintptr_t address = 0;
  Phase phase = Phase::setup;  // when it was allocated
};

// "layers.7.ffn.w1_out", "layers.7.attn.q_proj.weight.grad", "adamw.m.lm_head.weight", "flash.delta".
std::string buffer_name(const AllocTag& tag);
// "src/lmscope/model/transformer.cpp:245": the line that asked for the buffer.
std::string buffer_source(const AllocTag& tag);
// The path of lmscope's source file from the compiler's name for it.
std::string source_path(const char* file);
// "layers.7.attn.q_proj.weight" -> "layers.{i}.attn.q_proj.weight" (also inside "adamw.m.layers.7...").
std::string without_layer_number(std::string name);
// The op-level name of a buffer, layers folded: "ffn.w1_out", "attn.q_proj.weight (grad)".
std::string op_name(const AllocTag& tag);

struct MemoryAnalysis {
  std::size_t at_step_start = 0, at_step_end = 0;
  std::size_t reserved_at_step_end = 0;  // allocated plus cached
  std::size_t paged_at_step_end = 0;     // that, as the CUDA driver counts it (MemoryReplay)
  std::size_t peak = 0;                  // allocated bytes, the step's maximum
  std::size_t peak_event = 0;            // index into the record's events where it is reached (an alloc)
  bool peak_at_start = false;            // the step never held more than it started with
  Phase peak_phase = Phase::setup;
  AllocTag peak_tag;                 // the request that reached it
  std::size_t reserved_at_peak = 0;  // allocated plus cached at that moment
  std::size_t peak_reserved = 0;     // the step's maximum of allocated plus cached
  // The whole record's maximum of the allocator's segments as the device counts them (the CUDA
  // driver's 2 MiB pages for cuda): what decides whether a run fits.
  std::size_t peak_segments_on_device = 0;
  std::array<std::size_t, kMemKinds> peak_by_kind{};
  std::vector<std::pair<std::string, std::size_t>> peak_by_op;  // largest first
  std::array<std::optional<std::size_t>, kPhases> phase_peak;   // phases the step has
  std::optional<std::size_t> held_at_backward;                  // when the step has one
  std::optional<std::size_t> held_at_optimizer;                 // just before the optimizer step (train)
  std::vector<LiveBuffer> top;                                  // largest live buffers at the peak
  std::size_t live_at_peak = 0;                                 // how many buffers
};

// top: how many of the largest live buffers to keep (at least 1).
MemoryAnalysis analyze_memory(const MemoryRecord& record, int top);

// What the whole device needs for a record: what it holds beyond the allocator (the CUDA context
// and libraries; 0 where not known) plus the allocator's segments at their peak as it counts them.
std::size_t device_need(const MemoryRecord& record, const MemoryAnalysis& analysis);
// What the record's device may hold in all: the memory limit (a dry run) or the device's memory.
std::size_t device_limit(const MemoryRecord& record);

// Replays a record's events, keeping the live buffers and the segments.
class MemoryReplay {
 public:
  struct Segment {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
    bool small = false;                         // of the pool for requests under 1 MiB
    std::map<std::uintptr_t, LiveBuffer> live;  // the blocks handed out, by address
  };
  void apply(const MemEvent& e);
  std::size_t allocated() const { return allocated_; }
  std::size_t reserved() const { return reserved_; }
  // The segments as the CUDA driver counts them: each of 1 MiB or more in whole 2 MiB pages, the
  // smaller ones packed (measured on the H100: docs/memory.md).
  std::size_t reserved_in_pages() const { return paged_; }
  std::size_t allocated(MemKind k) const { return by_kind_[static_cast<int>(k)]; }
  std::vector<LiveBuffer> live() const;   // in allocation order
  std::vector<Segment> segments() const;  // in the order made

 private:
  std::map<std::uint64_t, LiveBuffer> live_;  // by allocation order
  std::map<std::uint64_t, Segment> segments_;
  std::unordered_map<std::uintptr_t, std::uint64_t> live_at_;
  std::map<std::uintptr_t, std::uint64_t> segment_at_;  // by base address
  Segment* segment_of(std::uintptr_t address);
  std::uint64_t next_ = 0;
  std::size_t allocated_ = 0, reserved_ = 0, paged_ = 0;
  std::array<std::size_t, kMemKinds> by_kind_{};
};

}  // namespace lmscope
