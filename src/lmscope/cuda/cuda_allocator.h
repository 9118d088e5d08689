// Device memory through a caching allocator, as PyTorch's: freed blocks are kept and handed to
// the next request of the same size (a training step repeats its sizes exactly), so cudaMalloc
// and cudaFree, which synchronise the device, leave the steady state. When cudaMalloc fails,
// the cache is released and the request tried once more before OutOfMemory.
#pragma once

#include "lmscope/core/allocator.h"

namespace lmscope {

class CudaAllocator : public Allocator {
 public:
  explicit CudaAllocator(int device);
  ~CudaAllocator() override;
  std::string device_name() const override { return name_; }
  std::size_t capacity() const override { return capacity_; }
  std::size_t cached_bytes() const { return cache_.bytes(); }
  void release_cache();

 protected:
  void* raw_allocate(std::size_t bytes, const AllocTag& tag) override;
  void raw_free(void* p, std::size_t bytes) override;

 private:
  std::string name_;
  std::size_t capacity_ = 0;
  BlockCache cache_;
};

}  // namespace lmscope
