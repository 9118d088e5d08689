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
  cache_.release([](void* p) { cudaFree(p); });
}

void* CudaAllocator::raw_allocate(std::size_t bytes, const AllocTag& tag) {
  if (void* p = cache_.take(bytes)) return p;
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

void CudaAllocator::raw_free(void* p, std::size_t bytes) { cache_.put(p, bytes); }

}  // namespace lmscope
