// Makes a GPU the current one of this thread while in scope, and the one current before current
// again after: every call of a backend on GPU n runs its CUDA work (allocations, streams, launches,
// events) on GPU n whichever device the caller had current, so backends on several GPUs may be used
// from one thread. Where it is current already, this costs a cudaGetDevice. It throws nothing (it
// guards destructors too): where the driver refuses, the next checked call says so.
#pragma once

#include <cuda_runtime.h>

namespace lmscope::cuda {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) noexcept : device_(device), previous_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = device_;
    if (previous_ != device_) cudaSetDevice(device_);
  }
  ~DeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_;
};

}  // namespace lmscope::cuda
