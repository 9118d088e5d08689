// What the engine knows of a device that the dry run needs too: what the flash-attention plan reads
// of a GPU (FlashKernelFacts), and what was measured on an H100 80GB HBM3 (SXM5, 132 SMs), stored here
// for dry runs where none is visible. The GPU tests compare the stored facts with the live ones, so a
// change to the kernels that changes them fails there. Plain C++17 with no CUDA headers: the
// shape-only dry run uses it on machines without CUDA, and nvcc reads it (through kernels.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace lmscope {

// Per tensor-core head dim, CTAs of each kernel one SM holds at once (0: not asked, as for the Hopper
// kernels where they do not run). `atomic`: the dK/dV kernel that also adds dQ by atomics.
struct FlashResidency {
  int d = 0;
  int forward_tc = 0, dkdv_tc = 0, dkdv_tc_atomic = 0, dq_tc = 0;
  int forward_wgmma = 0, backward_wgmma = 0, backward_wgmma_atomic = 0, dq_wgmma = 0;
};

// What a flash-attention plan reads of the GPU: its SMs, whether the Hopper (sm_90a) kernels run
// there, and the residency of every tensor-core kernel.
struct FlashKernelFacts {
  int sms = 0;
  bool hopper = false;
  std::vector<FlashResidency> residency;  // head dims 16, 32, 64, 80, 96, 128
  const FlashResidency& at(int d) const;
};

// What a backend's device is (device/device.h): what the dry run and the plans read of it.
struct DeviceFacts {
  std::string name;  // as the driver names it ("NVIDIA H100 80GB HBM3"); "cpu" for the host
  int compute_major = 0, compute_minor = 0;
  int sms = 0;
  std::size_t memory_bytes = 0;  // the GPU's (totalGlobalMem); the host's available memory for cpu
  FlashKernelFacts flash;        // cuda: what the flash-attention plan reads (its hopper: the wgmma kernels run)
  bool hopper() const { return compute_major == 9; }
};

// The stored H100's, as a DeviceFacts (the pieces below).
const DeviceFacts& h100_facts();
// The CUDA backend's flash facts as read on the H100 with this build's sm_90a kernels.
const FlashKernelFacts& h100_flash_facts();
// Device memory in use beyond lmscope's allocator once the CUDA backend is made (the CUDA context and
// cuBLASLt's handle; its workspace is the allocator's), as cudaMemGetInfo reported it; and where and
// when that was.
std::size_t h100_device_overhead_bytes();
// What cudaGetDeviceProperties calls its totalGlobalMem (less than 80 GiB).
std::size_t h100_memory_bytes();
// How much of the device a cudaMalloc of `bytes` takes as the driver counts it: one of 1 MiB or
// more takes whole 2 MiB pages, smaller ones are packed (measured on the H100: docs/memory.md).
std::size_t driver_segment_bytes(std::size_t bytes);
const char* h100_device_overhead_source();

}  // namespace lmscope
