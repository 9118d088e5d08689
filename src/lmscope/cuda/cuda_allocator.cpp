#include "lmscope/cuda/cuda_allocator.h"
#include "lmscope/cuda/cuda_check.h"

namespace lmscope {

CudaAllocator::CudaAllocator(int device) {
  cudaDeviceProp p{};
  LMSCOPE_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  name_ = fmt::format("cuda:{} ({})", device, p.name);
  capacity_ = p.totalGlobalMem;
}

CudaAllocator::~CudaAllocator() { release_cache(); }

void CudaAllocator::release_cache() {
  for (auto& [bytes, p] : free_blocks_) cudaFree(p);
  free_blocks_.clear();
  cached_ = 0;
}

void* CudaAllocator::raw_allocate(std::size_t bytes, const AllocTag& tag) {
  if (auto it = free_blocks_.find(bytes); it != free_blocks_.end()) {
    void* p = it->second;
    free_blocks_.erase(it);
    cached_ -= bytes;
    return p;
  }
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();  // clear the error; try again with the cache given back
    release_cache();
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      throw_oom(bytes, tag);
    }
  }
  return p;
}

void CudaAllocator::raw_free(void* p, std::size_t bytes) {
  free_blocks_.emplace(bytes, p);
  cached_ += bytes;
}

}  // namespace lmscope
