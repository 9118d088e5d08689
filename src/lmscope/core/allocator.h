// The one allocator interface every buffer comes from. It knows what each buffer holds
// (parameter, gradient, optimizer state, activation of op X in layer i, workspace, input)
// and the phase it was made in, keeps current and peak bytes per kind, and can record every
// alloc/free event. Memory profiling is a reader of this record, not a separate instrument.
// Backends derive from it and supply raw_allocate/raw_free.
#pragma once

#include "lmscope/core/tensor.h"

#include <array>
#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace lmscope {

enum class MemKind { parameter, gradient, optimizer_state, activation, workspace, input };
inline constexpr int kMemKinds = 6;
const char* mem_kind_name(MemKind k);

enum class Phase { setup, forward, backward, optimizer };
const char* phase_name(Phase p);

struct AllocTag {
  MemKind kind = MemKind::workspace;
  std::string what;  // parameter name, or the op that saved the activation ("attn.probs")
  int layer = -1;    // transformer layer, -1 when none
};

struct MemEvent {
  bool is_alloc = true;
  std::size_t bytes = 0;
  std::uintptr_t address = 0;
  AllocTag tag;
  Phase phase = Phase::setup;
  double time_us = 0;  // since the allocator was made
};

class Allocator;

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

 private:
  friend class Allocator;
  Allocator* owner_ = nullptr;
  Tensor tensor_;
  AllocTag tag_;
  std::size_t bytes_ = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual std::string device_name() const = 0;
  // Bytes this allocator may hand out in all (device memory, or the host's available memory).
  virtual std::size_t capacity() const = 0;

  // Throws OutOfMemory when the memory cannot be had.
  Allocation allocate(Shape shape, DType dtype, AllocTag tag);

  void set_phase(Phase p) { phase_ = p; }
  Phase phase() const { return phase_; }

  void record_events(bool on) { recording_ = on; }
  const std::vector<MemEvent>& events() const { return events_; }
  void clear_events() { events_.clear(); }

  std::size_t current_bytes() const { return current_; }
  std::size_t peak_bytes() const { return peak_; }
  std::size_t current_bytes(MemKind k) const { return current_by_kind_[static_cast<int>(k)]; }
  void reset_peak() { peak_ = current_; }

 protected:
  virtual void* raw_allocate(std::size_t bytes, const AllocTag& tag) = 0;  // throws OutOfMemory via throw_oom
  virtual void raw_free(void* p, std::size_t bytes) = 0;
  [[noreturn]] void throw_oom(std::size_t bytes, const AllocTag& tag) const;

 private:
  friend class Allocation;
  void release(Allocation& a);
  void record(bool is_alloc, const Allocation& a);

  Phase phase_ = Phase::setup;
  bool recording_ = false;
  std::vector<MemEvent> events_;
  std::size_t current_ = 0, peak_ = 0;
  std::array<std::size_t, kMemKinds> current_by_kind_{};
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Freed blocks kept for reuse by a later request of exactly the same size: a training step asks
// for the same sizes every time. Shared by the host and device allocators.
class BlockCache {
 public:
  void* take(std::size_t bytes);  // a cached block of that size, or nullptr
  void put(void* p, std::size_t bytes);
  // Hands every cached block to free_block(p) and forgets them.
  template <typename FreeBlock>
  void release(FreeBlock&& free_block) {
    for (auto& [bytes, p] : blocks_) free_block(p);
    blocks_.clear();
    bytes_ = 0;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::multimap<std::size_t, void*> blocks_;
  std::size_t bytes_ = 0;
};

// Host memory, 64-byte aligned, with freed blocks kept for reuse by a request of the same size:
// a training step asks for the same sizes every time, and fresh pages would fault in every step
// (measured 9.5 s of system time in 7 small train steps before this cache). Capacity is the
// memory the OS reports available when the allocator is made, so an impossible request is
// refused with OutOfMemory instead of overcommitting and being killed later.
class HostAllocator : public Allocator {
 public:
  explicit HostAllocator(std::size_t capacity = 0);  // 0: the host's available memory
  ~HostAllocator() override;
  std::string device_name() const override { return "cpu"; }
  std::size_t capacity() const override { return capacity_; }
  std::size_t cached_bytes() const { return cache_.bytes(); }
  void release_cache();

 protected:
  void* raw_allocate(std::size_t bytes, const AllocTag& tag) override;
  void raw_free(void* p, std::size_t bytes) override;

 private:
  std::size_t capacity_;
  BlockCache cache_;
};

std::size_t host_available_memory();
std::string human_bytes(double bytes);

}  // namespace lmscope
