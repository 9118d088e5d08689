#include "lmscope/device/device_facts.h"

#include <stdexcept>
#include <string>

namespace lmscope {

const FlashResidency& FlashKernelFacts::at(int d) const {
  for (const FlashResidency& r : residency)
    if (r.d == d) return r;
  throw std::logic_error("flash attention: no residency known for head dim " + std::to_string(d));
}

// Printed by the GPU test MemoryOnGpu.StoredH100FactsAreThisH100s on the H100 80GB HBM3 of
// ../shared/GPU-MACHINE.md (2026-11-23; d 80's Hopper kernels 2026-11-27), which also checks them
// against the live ones.
const FlashKernelFacts& h100_flash_facts() {
  // d: forward_tc, dkdv_tc, dkdv_tc_atomic, dq_tc, forward_wgmma, backward_wgmma, backward_wgmma_atomic, dq_wgmma
  static const FlashKernelFacts facts{132,
                                      true,
                                      {{16, 5, 5, 4, 4, 0, 0, 0, 0},
                                       {32, 4, 4, 4, 4, 2, 1, 1, 2},
                                       {64, 3, 2, 2, 2, 2, 1, 1, 1},
                                       {80, 3, 2, 2, 2, 1, 1, 0, 1},
                                       {96, 2, 2, 2, 2, 0, 0, 0, 0},
                                       {128, 2, 2, 2, 2, 1, 1, 1, 1}}};
  return facts;
}

const DeviceFacts& h100_facts() {
  static const DeviceFacts facts{"NVIDIA H100 80GB HBM3", 9, 0, 132, h100_memory_bytes(), h100_flash_facts()};
  return facts;
}

// Measured as 590151680 when cuBLASLt's 32 MiB workspace was a cudaMalloc of its own beside the
// allocator; it now comes from the allocator (scratch::cuda_gemm_workspace) and is in its record, so
// exactly those 33554432 bytes are taken off what was measured.
std::size_t h100_device_overhead_bytes() { return 590151680 - 33554432; }
std::size_t h100_memory_bytes() { return 85017493504; }

std::size_t driver_segment_bytes(std::size_t bytes) {
  constexpr std::size_t kPage = std::size_t(2) << 20;
  return bytes >= (std::size_t(1) << 20) ? (bytes + kPage - 1) / kPage * kPage : bytes;
}

const char* h100_device_overhead_source() {
  return "measured on an H100 80GB HBM3, driver 580, CUDA 13.0, 2026-11-23: lmscope memory --device cuda, "
         "cudaMemGetInfo when the backend was made, less cuBLASLt's 32 MiB workspace (now the allocator's)";
}

}  // namespace lmscope
