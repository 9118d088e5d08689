// Device memory for the caching allocator (core/allocator.h): a segment is one cudaMalloc, which
// synchronises the device, so the cache keeps it out of the steady state. Its segments are GPU
// `device`'s whichever device is current when a buffer is asked for.
#pragma once

#include "lmscope/core/allocator.h"

#include <functional>

namespace lmscope {

class CudaAllocator : public Allocator {
 public:
  explicit CudaAllocator(int device);
  int device() const { return device_; }
  ~CudaAllocator() override { release_all(); }
  std::string device_name() const override { return name_; }
  std::size_t capacity() const override { return capacity_; }
  // Called before a segment goes back to the driver: recorded device graphs may point into it.
  void on_segment_free(std::function<void()> f) { before_segment_free_ = std::move(f); }

 protected:
  void* segment_allocate(std::size_t bytes) override;
  void segment_free(void* p, std::size_t bytes) override;

 private:
  int device_;
  std::string name_;
  std::size_t capacity_ = 0;
  std::function<void()> before_segment_free_;
};

}  // namespace lmscope
