// What the dry run knows of an H100 80GB HBM3 (SXM5, 132 SMs) when none is visible: facts measured
// on one and stored here. The GPU tests compare them with the live ones, so a change to the
// kernels that changes them fails there.
#pragma once

#include "lmscope/cuda/flash_plan.h"

#include <cstddef>

namespace lmscope::cuda {

// flash_kernel_facts() as read on the H100 with this build's sm_90a kernels.
const FlashKernelFacts& h100_flash_facts();
// Device memory in use beyond lmscope's allocator once the CUDA backend is made (the CUDA context,
// cuBLASLt's handle and its workspace), as cudaMemGetInfo reported it; and where and when that was.
std::size_t h100_device_overhead_bytes();
// What cudaGetDeviceProperties calls its totalGlobalMem (less than 80 GiB).
std::size_t h100_memory_bytes();
// How much of the device a cudaMalloc of `bytes` takes as the driver counts it: one of 1 MiB or
// more takes whole 2 MiB pages, smaller ones are packed (measured on the H100: docs/memory.md).
std::size_t driver_segment_bytes(std::size_t bytes);
const char* h100_device_overhead_source();

}  // namespace lmscope::cuda
