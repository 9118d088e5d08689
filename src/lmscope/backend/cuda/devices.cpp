#include "lmscope/backend/devices.h"
#include "lmscope/backend/cuda/cuda_check.h"
#include "lmscope/backend/cuda/device_guard.h"
#include "lmscope/backend/cuda/kernels.h"
#include "lmscope/core/error.h"
#include "lmscope/device/device.h"

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

int current_cuda_device() {
  int device = 0;
  LMSCOPE_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

Device cuda_device(int index) {
  const std::vector<GpuInfo> gpus = list_gpus();
  if (index < 0 || static_cast<std::size_t>(index) >= gpus.size())
    user_error("there is no GPU {}: this process sees {}", index, gpus.size());
  const GpuInfo& g = gpus[static_cast<std::size_t>(index)];
  DeviceFacts f;
  f.name = g.name;
  f.compute_major = g.compute_major;
  f.compute_minor = g.compute_minor;
  f.sms = g.multiprocessors;
  f.memory_bytes = g.memory_bytes;
  const cuda::DeviceGuard on(index);  // the kernels' residency is asked of that GPU
  f.flash = cuda::flash_kernel_facts();
  return Device(DeviceKind::cuda, index, std::move(f));
}

FlashKernelFacts visible_gpu_flash_facts() { return cuda_device(current_cuda_device()).facts().flash; }

}  // namespace lmscope
