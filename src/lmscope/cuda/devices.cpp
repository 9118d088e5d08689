#include "lmscope/backend/devices.h"
#include "lmscope/cuda/kernels.h"

#include <cuda_runtime.h>

namespace lmscope {

bool built_with_cuda() { return true; }

std::vector<GpuInfo> list_gpus() {
  std::vector<GpuInfo> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the sticky error, report none
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({p.name, p.major, p.minor, p.multiProcessorCount, p.totalGlobalMem});
  }
  return out;
}

cuda::FlashKernelFacts visible_gpu_flash_facts() { return cuda::flash_kernel_facts(); }

}  // namespace lmscope
