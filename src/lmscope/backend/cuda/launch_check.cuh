// Kernel launchers report a bad launch at once. Kept free of fmt and lmscope's C++20 headers:
// .cu files hold kernels only, and the host code that uses them is compiled as C++.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace lmscope::cuda {

inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("CUDA launch of ") + kernel + " failed: " + cudaGetErrorString(err));
}

}  // namespace lmscope::cuda
