// The one allocator interface every buffer comes from. It knows what each buffer holds
// (parameter, gradient, optimizer state, activation of op X in layer i, workspace, input)
// and the phase it was made in, keeps current and peak bytes per kind, and can record every
// alloc/free event. Memory profiling is a reader of this record, not a separate instrument.
//
// It is also the caching allocator of every backend, shaped as PyTorch's: memory comes from the
// system in segments, a request takes the smallest free block of its pool that holds it (split when
// larger), and a freed block merges with its free neighbours, so memory one buffer gave back serves
// requests of any size (a gradient freed by the optimizer holds the bf16 weight copy it rewrites).
// The system's allocator, which on the GPU synchronises the device, leaves the steady state.
// Requests under 1 MiB share 2 MiB segments (the small pool), larger ones get segments rounded to
// 2 MiB (what the CUDA driver maps anyway) and grown with what is held (Allocator::new_segment). Ties go to the oldest
// segment and the lowest offset, never to an address, so the host, the GPU and the shape-only dry run, which supply
// only segment_allocate/segment_free, make the same choices and their records agree event for event.
#pragma once

#include "lmscope/core/tensor.h"

#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <source_location>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace lmscope {

enum class MemKind { parameter, gradient, optimizer_state, activation, workspace, input };
inline constexpr int kMemKinds = 6;
const char* mem_kind_name(MemKind k);

enum class Phase { setup, forward, backward, optimizer };
inline constexpr int kPhases = 4;
const char* phase_name(Phase p);

struct AllocTag {
  MemKind kind = MemKind::workspace;
  std::string what;  // parameter name, or the op that saved the activation ("attn.probs")
  int layer = -1;    // transformer layer, -1 when none
  // The line of lmscope's code that asked for the buffer (Allocator::allocate fills it in).
  const char* file = nullptr;
  int line = 0;
  bool operator==(const AllocTag& o) const {
    return kind == o.kind && what == o.what && layer == o.layer && line == o.line &&
           std::string_view(file ? file : "") == std::string_view(o.file ? o.file : "");
  }
};

// alloc: a buffer handed out (from the cache or a new segment); free: given back to the cache;
// segment_alloc: a new block from the system (just before the alloc it serves); segment_free: a
// cached block given back to the system; oom: a request that could not be served.
enum class MemAction { alloc, free, segment_alloc, segment_free, oom };
const char* mem_action_name(MemAction a);

struct MemEvent {
  MemAction action = MemAction::alloc;
  std::size_t bytes = 0;  // rounded to 256 as held
  std::uintptr_t address = 0;
  AllocTag tag;  // the buffer's (or, for segment events, the request's); empty for segment_free
  Shape shape;   // alloc, free and oom
  DType dtype = DType::f32;
  Phase phase = Phase::setup;
  double time_us = 0;  // host clock since the allocator was made
};

class Allocator;

// Memory for a region (Allocator::open_region) from somewhere other than the allocator's own
// segments: NCCL's symmetric window (parallel/communicator.h).
struct RegionMemory {
  std::function<void*(std::size_t)> allocate;  // nullptr when there is none to be had
  std::function<void(void*, std::size_t)> free;
  explicit operator bool() const { return static_cast<bool>(allocate); }
};

// Move-only owner of one allocated tensor; gives the memory back when destroyed.
class Allocation {
 public:
  Allocation() = default;
  Allocation(Allocation&& o) noexcept { *this = std::move(o); }
  Allocation& operator=(Allocation&& o) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  ~Allocation() { reset(); }

  void reset();
  const Tensor& tensor() const { return tensor_; }
  operator const Tensor&() const { return tensor_; }  // NOLINT: lets ops take owners directly
  const AllocTag& tag() const { return tag_; }
  bool empty() const { return owner_ == nullptr; }
  // From here on tensor() is `part` of the memory (which must lie within it), as is block() the whole
  // as allocated; the whole is still what is held and given back. Data parallelism's all-gather keeps
  // a gradient as one rank's part of a block with every rank's (parallel/data_parallel.h).
  void narrow(const Tensor& part);
  const Tensor& block() const { return block_; }

 private:
  friend class Allocator;
  Allocator* owner_ = nullptr;
  Tensor tensor_;
  Tensor block_;  // as allocated: tensor_ unless narrowed
  AllocTag tag_;
  std::size_t bytes_ = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual std::string device_name() const = 0;
  // Bytes this allocator may hand out in all (device memory, or the host's available memory).
  virtual std::size_t capacity() const = 0;

  // Sizes are rounded up to whole 256-byte units, as device allocators do, so the accounting
  // matches what is really held. Throws OutOfMemory when the memory cannot be had.
  static std::size_t rounded_bytes(std::size_t bytes) { return (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256; }
  // `where` names the caller unless the tag already names a line (helpers pass their caller's on).
  Allocation allocate(Shape shape, DType dtype, AllocTag tag,
                      std::source_location where = std::source_location::current());
  // A buffer in a segment of its own, outside the caching policy: the segment is the request's size
  // (in segment units), serves nothing else, goes back to the system when the buffer is freed, and
  // does not count towards the size later segments grow to. For a long-lived buffer made in the midst
  // of others (cuBLASLt's workspace at the first matrix product), which in a pool would split a block
  // and change every later segment's size. Recorded as any allocation is.
  Allocation allocate_apart(Shape shape, DType dtype, AllocTag tag,
                            std::source_location where = std::source_location::current());

  void set_phase(Phase p) { phase_ = p; }
  Phase phase() const { return phase_; }

  void record_events(bool on) { recording_ = on; }
  // Microseconds on the clock its events are stamped with (host time since the allocator was made).
  double now_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count();
  }
  // The same clock's zero, in nanoseconds since the steady clock's epoch (where device records'
  // times count from: profile/kernel_profile.h).
  std::uint64_t clock_origin_ns() const {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(start_.time_since_epoch()).count());
  }
  const std::vector<MemEvent>& events() const { return events_; }
  void clear_events() { events_.clear(); }

  std::size_t current_bytes() const { return current_; }
  std::size_t peak_bytes() const { return peak_; }
  std::size_t current_bytes(MemKind k) const { return current_by_kind_[static_cast<int>(k)]; }
  void reset_peak() { peak_ = current_; }
  // Held from the system: handed out plus cached.
  std::size_t reserved_bytes() const { return reserved_; }
  std::size_t cached_bytes() const { return reserved_ - current_; }
  // Gives every segment with nothing handed out back to the system (nothing while held).
  void release_cache();
  // While held, no segment goes back to the system, not even to retry a request that failed: a device
  // graph being recorded or replayed may use any block of any segment (Backend::begin_graph).
  void hold_segments(bool held) { segments_held_ = held; }
  // A region of `bytes` that serves every request of `kind` it can hold, ahead of the pools, by a
  // segment's rules (smallest block that holds it, lowest offset), so ranks that make the same requests
  // get the same offsets in it: data parallelism's gradients in NCCL's symmetric window
  // (parallel/data_parallel.h). Its memory comes from `memory` when given, else from segment_allocate. A
  // request it cannot hold goes to the pools. close_region ends the serving: the region then serves
  // nothing more and goes back (through `memory`'s free) at once if empty, else with the next
  // release_cache after its last block is freed. One region is open at a time.
  void open_region(MemKind kind, std::size_t bytes, AllocTag tag, RegionMemory memory = {});
  void close_region();
  bool region_open() const { return open_region_ != 0; }

  // A hash of everything the next requests' addresses depend on: the segments (where, how large,
  // their age order) and how their blocks are cut and which are free. Two equal hashes mean the same
  // requests get the same addresses, which is what lets a recorded device graph be replayed
  // (Backend::begin_graph).
  std::uint64_t state_hash() const;

  static constexpr std::size_t kSmallRequest = std::size_t(1) << 20;  // below: the small pool
  static constexpr std::size_t kSegmentUnit = std::size_t(2) << 20;   // segment sizes are multiples
  static constexpr std::size_t kLargeSegmentCap = std::size_t(1) << 30;

 protected:
  // A new block of `bytes` from the system, or nullptr when there is none to be had.
  virtual void* segment_allocate(std::size_t bytes) = 0;
  virtual void segment_free(void* p, std::size_t bytes) = 0;
  // Derived destructors call this: segment_free is theirs and gone once they are.
  void release_all() {
    close_region();
    release_cache();
  }

 private:
  friend class Allocation;
  Allocation make(Shape shape, DType dtype, AllocTag tag, std::source_location where, bool apart);
  void* raw_allocate(std::size_t bytes, const AllocTag& tag, const Shape& shape, DType dtype);
  void* apart_segment(std::size_t bytes, const AllocTag& tag, const Shape& shape, DType dtype);
  void release(Allocation& a);
  void record(MemAction action, std::size_t bytes, std::uintptr_t address, const AllocTag& tag, const Shape& shape,
              DType dtype);
  [[noreturn]] void throw_oom(std::size_t bytes, const AllocTag& tag, const Shape& shape, DType dtype);

  // A segment from the system, cut into blocks that tile it (by offset: size and whether free).
  struct Segment {
    std::uint64_t order = 0;  // made order: ties in the pools go to older segments
    std::uintptr_t base = 0;
    std::size_t bytes = 0;
    bool small = false;
    std::map<std::size_t, std::pair<std::size_t, bool>> blocks;  // offset -> (bytes, free)
    bool region = false;                                         // open_region's: a pool of its own
    bool apart = false;                                          // allocate_apart's (a pool of its own too)
    std::function<void(void*, std::size_t)> give_back;           // a region's RegionMemory::free
  };
  // A free block in a pool: the smallest that holds a request wins, then the oldest segment, then
  // the lowest offset.
  struct FreeBlock {
    std::size_t bytes;
    std::uint64_t order;
    std::size_t offset;
    std::uintptr_t base;  // not part of the order
    bool operator<(const FreeBlock& o) const {
      return std::tie(bytes, order, offset) < std::tie(o.bytes, o.order, o.offset);
    }
  };
  std::set<FreeBlock>& pool(const Segment& s) {
    return s.region || s.apart ? region_free_[s.base] : s.small ? small_free_ : large_free_;
  }
  // A segment for a request of `bytes`, grown to Allocator's usual size or just the request's.
  void* new_segment(std::size_t bytes, bool grown, const AllocTag& tag, DType dtype);
  void* take(std::set<FreeBlock>& pool, std::set<FreeBlock>::iterator it, std::size_t bytes);
  void give_back(Segment& s);  // a wholly free segment, to the system (or its region's memory)
  Segment& segment_of(std::uintptr_t p);

  std::map<std::uintptr_t, Segment> segments_;  // by base address
  std::set<FreeBlock> small_free_, large_free_;
  std::map<std::uintptr_t, std::set<FreeBlock>> region_free_;  // each region's, by its base
  std::uintptr_t open_region_ = 0;                             // the base of the one serving, or 0
  MemKind region_kind_ = MemKind::gradient;
  std::uint64_t next_order_ = 0;
  std::size_t reserved_ = 0;
  std::size_t reserved_apart_ = 0;  // of that, allocate_apart's segments
  Phase phase_ = Phase::setup;
  bool recording_ = false;
  bool segments_held_ = false;
  std::vector<MemEvent> events_;
  std::size_t current_ = 0, peak_ = 0;
  std::array<std::size_t, kMemKinds> current_by_kind_{};
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Host memory, 64-byte aligned (2 MiB and huge pages from 2 MiB up). Cached blocks matter on the
// host too: fresh pages would fault in every step (measured 9.5 s of system time in 7 small train
// steps before the cache). Capacity is the memory the OS reports available when the allocator is
// made, so an impossible request is refused with OutOfMemory instead of overcommitting and being
// killed later.
class HostAllocator : public Allocator {
 public:
  explicit HostAllocator(std::size_t capacity = 0);  // 0: the host's available memory
  ~HostAllocator() override { release_all(); }
  std::string device_name() const override { return "cpu"; }
  std::size_t capacity() const override { return capacity_; }

 protected:
  void* segment_allocate(std::size_t bytes) override;
  void segment_free(void* p, std::size_t bytes) override;

 private:
  std::size_t capacity_;
};

std::size_t host_available_memory();
std::string human_bytes(double bytes);

}  // namespace lmscope
