#include "lmscope/core/allocator.h"
#include "lmscope/core/hash.h"

#include <sys/mman.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <string_view>

namespace lmscope {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

const char* mem_kind_name(MemKind k) {
  switch (k) {
    case MemKind::parameter:
      return "parameter";
    case MemKind::gradient:
      return "gradient";
    case MemKind::optimizer_state:
      return "optimizer_state";
    case MemKind::activation:
      return "activation";
    case MemKind::workspace:
      return "workspace";
    case MemKind::input:
      return "input";
  }
  return "?";
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::setup:
      return "setup";
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::optimizer:
      return "optimizer";
  }
  return "?";
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} {}", b, units[u]) : fmt::format("{:.2f} {}", b, units[u]);
}

const char* mem_action_name(MemAction a) {
  switch (a) {
    case MemAction::alloc:
      return "alloc";
    case MemAction::free:
      return "free";
    case MemAction::segment_alloc:
      return "segment_alloc";
    case MemAction::segment_free:
      return "segment_free";
    case MemAction::oom:
      return "oom";
  }
  return "?";
}

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_;
    tensor_ = std::move(o.tensor_);
    block_ = std::move(o.block_);
    tag_ = std::move(o.tag_);
    bytes_ = o.bytes_;
    o.owner_ = nullptr;
    o.tensor_ = Tensor{};
    o.block_ = Tensor{};
  }
  return *this;
}

void Allocation::reset() {
  if (owner_) owner_->release(*this);
  owner_ = nullptr;
  tensor_ = Tensor{};
  block_ = Tensor{};
}

void Allocation::narrow(const Tensor& part) {
  const auto begin = reinterpret_cast<std::uintptr_t>(block_.data), at = reinterpret_cast<std::uintptr_t>(part.data);
  LMSCOPE_CHECK(owner_ && part.dtype == block_.dtype && at >= begin && at + part.bytes() <= begin + block_.bytes(),
                "a part of {} bytes at {:+} of a block of {}", part.bytes(),
                static_cast<std::int64_t>(at) - static_cast<std::int64_t>(begin), block_.bytes());
  tensor_ = part;
}

Allocation Allocator::allocate(Shape shape, DType dtype, AllocTag tag, std::source_location where) {
  return make(std::move(shape), dtype, std::move(tag), where, false);
}

Allocation Allocator::allocate_apart(Shape shape, DType dtype, AllocTag tag, std::source_location where) {
  return make(std::move(shape), dtype, std::move(tag), where, true);
}

Allocation Allocator::make(Shape shape, DType dtype, AllocTag tag, std::source_location where, bool apart) {
  for (auto d : shape) LMSCOPE_CHECK(d >= 0, "negative dimension in {}", shape_str(shape));
  if (!tag.file) {
    tag.file = where.file_name();
    tag.line = static_cast<int>(where.line());
  }
  Allocation a;
  a.tensor_ = Tensor{nullptr, dtype, std::move(shape)};
  a.bytes_ = rounded_bytes(a.tensor_.bytes());
  a.tag_ = std::move(tag);
  a.tensor_.data = apart ? apart_segment(a.bytes_, a.tag_, a.tensor_.shape, dtype)
                         : raw_allocate(a.bytes_, a.tag_, a.tensor_.shape, dtype);
  a.block_ = a.tensor_;
  a.owner_ = this;
  current_ += a.bytes_;
  current_by_kind_[static_cast<int>(a.tag_.kind)] += a.bytes_;
  peak_ = std::max(peak_, current_);
  if (recording_)
    record(MemAction::alloc, a.bytes_, reinterpret_cast<std::uintptr_t>(a.tensor_.data), a.tag_, a.tensor_.shape,
           dtype);
  return a;
}

// The open region first for its kind; then the smallest free block of the request's pool that holds
// it; else a new segment, with the free segments given back to the system and one more try when the
// first fails.
void* Allocator::raw_allocate(std::size_t bytes, const AllocTag& tag, const Shape& shape, DType dtype) {
  if (open_region_ != 0 && tag.kind == region_kind_) {
    std::set<FreeBlock>& free = region_free_.at(open_region_);
    if (auto it = free.lower_bound(FreeBlock{bytes, 0, 0, 0}); it != free.end()) return take(free, it, bytes);
  }
  std::set<FreeBlock>& free = bytes < kSmallRequest ? small_free_ : large_free_;
  if (auto it = free.lower_bound(FreeBlock{bytes, 0, 0, 0}); it != free.end()) return take(free, it, bytes);
  void* p = new_segment(bytes, true, tag, dtype);
  if (!p) p = new_segment(bytes, false, tag, dtype);
  if (!p) {
    release_cache();
    p = new_segment(bytes, false, tag, dtype);
  }
  if (!p) throw_oom(bytes, tag, shape, dtype);
  return p;
}

void* Allocator::apart_segment(std::size_t bytes, const AllocTag& tag, const Shape& shape, DType dtype) {
  const std::size_t size = (bytes + kSegmentUnit - 1) / kSegmentUnit * kSegmentUnit;
  void* p = segment_allocate(size);
  if (!p) {
    release_cache();
    p = segment_allocate(size);
  }
  if (!p) throw_oom(bytes, tag, shape, dtype);
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  if (recording_) record(MemAction::segment_alloc, size, base, tag, {}, dtype);
  Segment& s = segments_[base];
  s = Segment{next_order_++, base, size, false, {{0, {size, true}}}, false, true, {}};
  reserved_ += size;
  reserved_apart_ += size;
  std::set<FreeBlock>& free = pool(s);
  return take(free, free.insert(FreeBlock{size, s.order, 0, base}).first, bytes);
}

void* Allocator::new_segment(std::size_t bytes, bool grown, const AllocTag& tag, DType dtype) {
  const bool small = bytes < kSmallRequest;
  // A large segment is at least an eighth of what is held already (up to 1 GiB) when grown: buffers
  // of neighbouring segments never merge, and few large segments let what the backward frees (the
  // activations, the weight copies) merge into blocks the gradients it makes fit in (the segments
  // apart, which serve no pool, are left out of what is held). Near the device's end the request's own
  // size is tried next.
  const std::size_t want =
      small ? kSegmentUnit : std::max(bytes, grown ? std::min(kLargeSegmentCap, (reserved_ - reserved_apart_) / 8) : 0);
  const std::size_t size = (want + kSegmentUnit - 1) / kSegmentUnit * kSegmentUnit;
  void* p = segment_allocate(size);
  if (!p) return nullptr;
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  if (recording_) record(MemAction::segment_alloc, size, base, tag, {}, dtype);
  Segment& s = segments_[base];
  s = Segment{next_order_++, base, size, small, {{0, {size, true}}}, false, false, {}};
  reserved_ += size;
  std::set<FreeBlock>& free = pool(s);
  return take(free, free.insert(FreeBlock{size, s.order, 0, base}).first, bytes);
}

void Allocator::open_region(MemKind kind, std::size_t bytes, AllocTag tag, RegionMemory memory) {
  LMSCOPE_CHECK(open_region_ == 0, "a region is open already");
  const std::size_t size = (std::max<std::size_t>(bytes, 1) + kSegmentUnit - 1) / kSegmentUnit * kSegmentUnit;
  void* p = memory ? memory.allocate(size) : segment_allocate(size);
  if (!p) {
    release_cache();
    p = memory ? memory.allocate(size) : segment_allocate(size);
  }
  if (!p) throw_oom(size, tag, {static_cast<std::int64_t>(size)}, DType::f32);
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  if (recording_) record(MemAction::segment_alloc, size, base, tag, {}, DType::f32);
  Segment& s = segments_[base];
  s = Segment{next_order_++, base, size, false, {{0, {size, true}}}, true, false, std::move(memory.free)};
  reserved_ += size;
  pool(s).insert(FreeBlock{size, s.order, 0, base});
  open_region_ = base;
  region_kind_ = kind;
}

void Allocator::close_region() {
  if (open_region_ == 0) return;
  Segment& s = segments_.at(open_region_);
  open_region_ = 0;
  if (!segments_held_ && s.blocks.size() == 1 && s.blocks.begin()->second.second) give_back(s);
}

// Hands out the front of a free block, leaving the rest free.
void* Allocator::take(std::set<FreeBlock>& free, std::set<FreeBlock>::iterator it, std::size_t bytes) {
  const FreeBlock b = *it;
  free.erase(it);
  Segment& s = segments_.at(b.base);
  s.blocks[b.offset] = {bytes, false};
  if (b.bytes > bytes) {
    s.blocks[b.offset + bytes] = {b.bytes - bytes, true};
    free.insert(FreeBlock{b.bytes - bytes, s.order, b.offset + bytes, s.base});
  }
  return reinterpret_cast<void*>(s.base + b.offset);  // NOLINT: device addresses are integers here
}

Allocator::Segment& Allocator::segment_of(std::uintptr_t p) {
  auto it = segments_.upper_bound(p);
  LMSCOPE_CHECK(it != segments_.begin(), "{:#x} is in no segment", p);
  --it;
  LMSCOPE_CHECK(p < it->first + it->second.bytes, "{:#x} is in no segment", p);
  return it->second;
}

void Allocator::release(Allocation& a) {
  if (recording_)
    record(MemAction::free, a.bytes_, reinterpret_cast<std::uintptr_t>(a.block_.data), a.tag_, a.block_.shape,
           a.block_.dtype);
  const auto p = reinterpret_cast<std::uintptr_t>(a.block_.data);
  Segment& s = segment_of(p);
  std::set<FreeBlock>& free = pool(s);
  auto it = s.blocks.find(p - s.base);
  LMSCOPE_CHECK(it != s.blocks.end() && !it->second.second, "{:#x} freed but not handed out", p);
  it->second.second = true;
  // Merge with a free neighbour after, then with one before.
  if (auto next = std::next(it); next != s.blocks.end() && next->second.second) {
    free.erase(FreeBlock{next->second.first, s.order, next->first, s.base});
    it->second.first += next->second.first;
    s.blocks.erase(next);
  }
  if (it != s.blocks.begin()) {
    if (auto prev = std::prev(it); prev->second.second) {
      free.erase(FreeBlock{prev->second.first, s.order, prev->first, s.base});
      prev->second.first += it->second.first;
      s.blocks.erase(it);
      it = prev;
    }
  }
  free.insert(FreeBlock{it->second.first, s.order, it->first, s.base});
  current_ -= a.bytes_;
  current_by_kind_[static_cast<int>(a.tag_.kind)] -= a.bytes_;
  if (s.apart && !segments_held_) give_back(s);
}

std::uint64_t Allocator::state_hash() const {
  // Which requests the open region serves decides addresses too.
  std::uint64_t h = hash_mix(hash_mix(hash_mix(0, std::uint64_t{segments_.size()}), std::uint64_t{open_region_}),
                             static_cast<std::uint64_t>(region_kind_));
  for (const auto& [base, s] : segments_) {
    h = hash_mix(hash_mix(hash_mix(hash_mix(hash_mix(h, std::uint64_t{base}), std::uint64_t{s.bytes}), s.order),
                          std::uint64_t{s.small}),
                 std::uint64_t{s.region});
    for (const auto& [offset, block] : s.blocks)
      h = hash_mix(hash_mix(hash_mix(h, std::uint64_t{offset}), std::uint64_t{block.first}),
                   std::uint64_t{block.second});
  }
  return h;
}

void Allocator::release_cache() {
  if (segments_held_) return;
  std::vector<Segment*> idle;  // in the order made, so every backend gives back in the same order
  for (auto& [base, s] : segments_)
    if (s.blocks.size() == 1 && s.blocks.begin()->second.second && base != open_region_) idle.push_back(&s);
  std::sort(idle.begin(), idle.end(), [](const Segment* a, const Segment* b) { return a->order < b->order; });
  for (Segment* s : idle) give_back(*s);
}

void Allocator::give_back(Segment& s) {
  const std::uintptr_t base = s.base;
  const std::size_t bytes = s.bytes;
  pool(s).erase(FreeBlock{bytes, s.order, 0, base});
  std::function<void(void*, std::size_t)> free = std::move(s.give_back);
  if (s.region || s.apart) region_free_.erase(base);
  if (s.apart) reserved_apart_ -= bytes;
  segments_.erase(base);
  reserved_ -= bytes;
  if (recording_) record(MemAction::segment_free, bytes, base, {}, {}, DType::f32);
  if (free)
    free(reinterpret_cast<void*>(base), bytes);  // NOLINT
  else
    segment_free(reinterpret_cast<void*>(base), bytes);  // NOLINT
}

void Allocator::record(MemAction action, std::size_t bytes, std::uintptr_t address, const AllocTag& tag,
                       const Shape& shape, DType dtype) {
  events_.push_back(MemEvent{action, bytes, address, tag, shape, dtype, phase_, now_us()});
}

void Allocator::throw_oom(std::size_t bytes, const AllocTag& tag, const Shape& shape, DType dtype) {
  if (recording_) record(MemAction::oom, bytes, 0, tag, shape, dtype);
  throw OutOfMemory(
      bytes, current_, capacity(),
      fmt::format("out of memory on {}: {} ({}{}) asked for {} with {} in use of {}", device_name(), tag.what,
                  mem_kind_name(tag.kind), tag.layer >= 0 ? fmt::format(", layer {}", tag.layer) : std::string(),
                  human_bytes(static_cast<double>(bytes)), human_bytes(static_cast<double>(current_)),
                  human_bytes(static_cast<double>(capacity()))));
}

std::size_t host_available_memory() {
  // Read without the C++ locale (a host process, such as Python's, may have set one of its own).
  std::ifstream f("/proc/meminfo");
  std::string line;
  constexpr std::string_view kKey = "MemAvailable:";
  while (std::getline(f, line)) {
    if (!line.starts_with(kKey)) continue;
    const char* p = line.data() + kKey.size();
    const char* end = line.data() + line.size();
    while (p < end && *p == ' ') ++p;
    std::size_t kib = 0;
    if (std::from_chars(p, end, kib).ec == std::errc() && kib > 0) return kib * 1024;
  }
  return std::size_t(1) << 40;  // unknown: do not invent a limit
}

HostAllocator::HostAllocator(std::size_t capacity) : capacity_(capacity ? capacity : host_available_memory()) {}

void* HostAllocator::segment_allocate(std::size_t bytes) {
  if (reserved_bytes() + bytes > capacity_) return nullptr;
  // Large blocks are 2 MiB aligned and asked to be backed by huge pages: first touches then
  // fault 512x less often (page faults dominated setup time on the 2-core machine).
  constexpr std::size_t kHuge = std::size_t(2) << 20;
  const bool huge = bytes >= kHuge;
  void* p = std::aligned_alloc(huge ? kHuge : 64, huge ? (bytes + kHuge - 1) / kHuge * kHuge : bytes);
  if (p && huge) ::madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

void HostAllocator::segment_free(void* p, std::size_t) { std::free(p); }

}  // namespace lmscope
