#include "lmscope/backend/devices.h"
#include "lmscope/core/error.h"
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

void use_gpu(int index) {
  const std::size_t n = list_gpus().size();
  if (index < 0 || static_cast<std::size_t>(index) >= n)
    user_error("this rank's local rank is {}, and the machine shows {} GPU{}: start at most one rank per GPU", index, n,
               n == 1 ? "" : "s");
  if (cudaSetDevice(index) != cudaSuccess)
    user_error("cannot use GPU {}: {}", index, cudaGetErrorString(cudaGetLastError()));
}

FlashKernelFacts visible_gpu_flash_facts() { return cuda::flash_kernel_facts(); }

}  // namespace lmscope
