// Which accelerators this build can see (empty without CUDA, a driver or a GPU).
#pragma once

#include "lmscope/device/flash_plan.h"

#include <cstdint>
#include <string>
#include <vector>

namespace lmscope {

struct GpuInfo {
  std::string name;
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
  std::size_t memory_bytes = 0;
};

bool built_with_cuda();
// The CUDA devices the driver reports; empty without CUDA, driver or GPU.
std::vector<GpuInfo> list_gpus();
// Makes GPU `index` the one this process's CUDA work goes to (a rank's LOCAL_RANK), before its
// backend is made; UserError when there is no such GPU.
void use_gpu(int index);
// What the flash-attention plan reads of the current GPU (cuda_device(current_cuda_device()), device
// 0 unless use_gpu chose another); the build must have CUDA and list_gpus() must not be empty.
FlashKernelFacts visible_gpu_flash_facts();

}  // namespace lmscope
