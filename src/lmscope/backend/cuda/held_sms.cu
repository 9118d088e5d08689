// Kernels that stand in for a collective's while GEMMs are timed beside one (gemm.cpp's plans for
// the backward of data parallelism): NCCL's kernels hold an SM a block for as long as a collective
// runs, and a GEMM planned for every SM waits on those it cannot have. (tools/gemm_beside_held_sms.cu
// keeps a copy of these kernels: it builds with nvcc alone.)
#include "lmscope/backend/cuda/kernels.h"
#include "lmscope/backend/cuda/launch_check.cuh"

#include <algorithm>

namespace lmscope::cuda {
namespace {

__device__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Each block holds its SM (its shared memory leaves no room for another GEMM's block) for `ns` from
// its start, and counts itself in *arrived as it starts.
__global__ void hold_sms_kernel(std::uint64_t ns, int* arrived) {
  extern __shared__ int smem[];
  if (threadIdx.x == 0) {
    atomicAdd(arrived, 1);
    const std::uint64_t t0 = global_ns();
    while (global_ns() - t0 < ns) __nanosleep(1000);
  }
  __syncthreads();
  smem[threadIdx.x] = 0;
}

__global__ void wait_for_held_sms_kernel(const volatile int* arrived, int count) {
  while (*arrived < count) __nanosleep(500);
}

}  // namespace

void hold_sms(int sms, double ms, int* arrived, cudaStream_t holder, cudaStream_t waiter) {
  int device = 0, optin = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  const int smem = std::min(optin, 200 * 1024);  // more than half an SM's: one block an SM
  cudaFuncSetAttribute(hold_sms_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  // The waiter reads the count only after it is reset, never the previous hold's.
  cudaEvent_t reset = nullptr;
  cudaEventCreateWithFlags(&reset, cudaEventDisableTiming);
  cudaMemsetAsync(arrived, 0, sizeof(int), holder);
  cudaEventRecord(reset, holder);
  cudaStreamWaitEvent(waiter, reset, 0);
  cudaEventDestroy(reset);  // released once it has fired
  hold_sms_kernel<<<sms, 128, smem, holder>>>(static_cast<std::uint64_t>(ms * 1e6), arrived);
  check_launch("hold_sms");
  wait_for_held_sms_kernel<<<1, 1, 0, waiter>>>(arrived, sms);
  check_launch("wait_for_held_sms");
}

}  // namespace lmscope::cuda
