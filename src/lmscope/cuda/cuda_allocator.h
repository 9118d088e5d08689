// Device memory for the caching allocator (core/allocator.h): a segment is one cudaMalloc, which
// synchronises the device, so the cache keeps it out of the steady state.
#pragma once

#include "lmscope/core/allocator.h"

namespace lmscope {

class CudaAllocator : public Allocator {
 public:
  explicit CudaAllocator(int device);
  ~CudaAllocator() override { release_all(); }
  std::string device_name() const override { return name_; }
  std::size_t capacity() const override { return capacity_; }

 protected:
  void* segment_allocate(std::size_t bytes) override;
  void segment_free(void* p, std::size_t bytes) override;

 private:
  std::string name_;
  std::size_t capacity_ = 0;
};

}  // namespace lmscope
