// Storage types and their conversion to and from the fp32 the kernels compute in.
#pragma once

#include "lmscope/cuda/kernels.h"

#include <cuda_bf16.h>

#include <stdexcept>

namespace lmscope::cuda {

__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ float ld(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T st(float x);
template <>
__device__ __forceinline__ float st<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);  // round to nearest even
}

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with T the C++ type of e.
template <typename F>
void with_elem(Elem e, F&& f) {
  if (e == Elem::f32)
    f(Tag<float>{});
  else if (e == Elem::bf16)
    f(Tag<__nv_bfloat16>{});
  else
    throw std::logic_error("unknown storage type");
}

}  // namespace lmscope::cuda
