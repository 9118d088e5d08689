#include "lmscope/cuda/cuda_allocator.h"
#include "lmscope/cuda/cuda_check.h"

namespace lmscope {

CudaAllocator::CudaAllocator(int device) {
  cudaDeviceProp p{};
  LMSCOPE_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  name_ = fmt::format("cuda:{} ({})", device, p.name);
  capacity_ = p.totalGlobalMem;
}

void* CudaAllocator::segment_allocate(std::size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) == cudaSuccess) return p;
  cudaGetLastError();  // clear the error: the caller gives its cache back and tries once more
  return nullptr;
}

void CudaAllocator::segment_free(void* p, std::size_t) {
  if (before_segment_free_) before_segment_free_();
  cudaFree(p);
}

}  // namespace lmscope
