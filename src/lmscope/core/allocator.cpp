#include "lmscope/core/allocator.h"

#include <sys/mman.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

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

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_;
    tensor_ = std::move(o.tensor_);
    tag_ = std::move(o.tag_);
    bytes_ = o.bytes_;
    o.owner_ = nullptr;
    o.tensor_ = Tensor{};
  }
  return *this;
}

void Allocation::reset() {
  if (owner_) owner_->release(*this);
  owner_ = nullptr;
  tensor_ = Tensor{};
}

Allocation Allocator::allocate(Shape shape, DType dtype, AllocTag tag) {
  for (auto d : shape) LMSCOPE_CHECK(d >= 0, "negative dimension in {}", shape_str(shape));
  Allocation a;
  a.tensor_ = Tensor{nullptr, dtype, std::move(shape)};
  // Round to 256 bytes as device allocators do, so accounting matches what is really held.
  a.bytes_ = (std::max<std::size_t>(a.tensor_.bytes(), 1) + 255) / 256 * 256;
  a.tag_ = std::move(tag);
  a.tensor_.data = raw_allocate(a.bytes_, a.tag_);
  a.owner_ = this;
  current_ += a.bytes_;
  current_by_kind_[static_cast<int>(a.tag_.kind)] += a.bytes_;
  peak_ = std::max(peak_, current_);
  if (recording_) record(true, a);
  return a;
}

void Allocator::release(Allocation& a) {
  if (recording_) record(false, a);
  raw_free(a.tensor_.data, a.bytes_);
  current_ -= a.bytes_;
  current_by_kind_[static_cast<int>(a.tag_.kind)] -= a.bytes_;
}

void Allocator::record(bool is_alloc, const Allocation& a) {
  double t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count();
  events_.push_back(MemEvent{is_alloc, a.bytes_, reinterpret_cast<std::uintptr_t>(a.tensor_.data), a.tag_, phase_, t});
}

void Allocator::throw_oom(std::size_t bytes, const AllocTag& tag) const {
  throw OutOfMemory(
      bytes, current_, capacity(),
      fmt::format("out of memory on {}: {} ({}{}) asked for {} with {} in use of {}", device_name(), tag.what,
                  mem_kind_name(tag.kind), tag.layer >= 0 ? fmt::format(", layer {}", tag.layer) : std::string(),
                  human_bytes(static_cast<double>(bytes)), human_bytes(static_cast<double>(current_)),
                  human_bytes(static_cast<double>(capacity()))));
}

std::size_t host_available_memory() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string key;
    std::size_t kib = 0;
    is >> key >> kib;
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::size_t(1) << 40;  // unknown: do not invent a limit
}

HostAllocator::HostAllocator(std::size_t capacity) : capacity_(capacity ? capacity : host_available_memory()) {}

HostAllocator::~HostAllocator() { release_cache(); }

void HostAllocator::release_cache() {
  cache_.release([](void* p) { std::free(p); });
}

void* HostAllocator::raw_allocate(std::size_t bytes, const AllocTag& tag) {
  if (void* p = cache_.take(bytes)) return p;
  if (current_bytes() + bytes > capacity_) throw_oom(bytes, tag);
  if (current_bytes() + cache_.bytes() + bytes > capacity_) release_cache();
  // Large blocks are 2 MiB aligned and asked to be backed by huge pages: first touches then
  // fault 512x less often (page faults dominated setup time on the 2-core machine).
  constexpr std::size_t kHuge = std::size_t(2) << 20;
  const bool huge = bytes >= kHuge;
  void* p = std::aligned_alloc(huge ? kHuge : 64, huge ? (bytes + kHuge - 1) / kHuge * kHuge : bytes);
  if (!p) throw_oom(bytes, tag);
  if (huge) ::madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

void HostAllocator::raw_free(void* p, std::size_t bytes) { cache_.put(p, bytes); }

void* BlockCache::take(std::size_t bytes) {
  auto it = blocks_.find(bytes);
  if (it == blocks_.end()) return nullptr;
  void* p = it->second;
  blocks_.erase(it);
  bytes_ -= bytes;
  return p;
}

void BlockCache::put(void* p, std::size_t bytes) {
  blocks_.emplace(bytes, p);
  bytes_ += bytes;
}

}  // namespace lmscope
