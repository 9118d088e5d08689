#include "lmscope/backend/cuda/cuda_allocator.h"
#include "lmscope/backend/cuda/cuda_check.h"
#include "lmscope/backend/cuda/device_guard.h"

namespace lmscope {

CudaAllocator::CudaAllocator(int device) : device_(device) {
  cudaDeviceProp p{};
  LMSCOPE_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  name_ = fmt::format("cuda:{} ({})", device, p.name);
  capacity_ = p.totalGlobalMem;
}

void* CudaAllocator::segment_allocate(std::size_t bytes) {
  const cuda::DeviceGuard on(device_);
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) == cudaSuccess) return p;
  cudaGetLastError();  // clear the error: the caller gives its cache back and tries once more
  return nullptr;
}

void CudaAllocator::segment_free(void* p, std::size_t) {
  const cuda::DeviceGuard on(device_);
  if (before_segment_free_) before_segment_free_();
  cudaFree(p);
}

}  // namespace lmscope
