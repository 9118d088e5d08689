// Every CUDA and cuBLASLt call in host code is checked; a failure names the call, file and line.
// (Kernel launches are checked in the .cu files by launch_check.cuh.)
#pragma once

#include "lmscope/core/error.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#define LMSCOPE_CUDA_CHECK(call)                                                                        \
  do {                                                                                                  \
    cudaError_t err_ = (call);                                                                          \
    if (err_ != cudaSuccess)                                                                            \
      throw std::runtime_error(fmt::format("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err_), \
                                           cudaGetErrorString(err_), #call, __FILE__, __LINE__));       \
  } while (0)

#define LMSCOPE_CUBLAS_CHECK(call)                                                                          \
  do {                                                                                                      \
    cublasStatus_t st_ = (call);                                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                       \
      throw std::runtime_error(                                                                             \
          fmt::format("cuBLAS error {} in {} at {}:{}", static_cast<int>(st_), #call, __FILE__, __LINE__)); \
  } while (0)
