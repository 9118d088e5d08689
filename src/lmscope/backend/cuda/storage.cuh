// Storage types and their conversion to and from the fp32 the kernels compute in.
#pragma once

#include "lmscope/backend/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <utility>

namespace lmscope::cuda {

__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ float ld(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ld(__half x) { return __half2float(x); }
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
template <>
__device__ __forceinline__ __half st<__half>(float x) {
  return __float2half_rn(x);  // round to nearest even; beyond 65504, inf
}

// N consecutive elements moved as one load or store of N·sizeof(T) bytes (16 for the kernels'
// choices); the address must be aligned to that.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
template <int N, typename T>
__device__ __forceinline__ void load(const T* p, float (&x)[N]) {
  const Pack<T, N> k = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = ld(k.v[i]);
}
template <int N, typename T>
__device__ __forceinline__ void store(T* p, const float (&x)[N]) {
  Pack<T, N> k;
#pragma unroll
  for (int i = 0; i < N; ++i) k.v[i] = st<T>(x[i]);
  *reinterpret_cast<Pack<T, N>*>(p) = k;
}
// The same N elements one at a time: for rows whose bases do not allow a pack, in a kernel that must
// take the same N (and so sum in the same order) either way.
template <bool PACKED, int N, typename T>
__device__ __forceinline__ void load_as(const T* p, float (&x)[N]) {
  if constexpr (PACKED) {
    load(p, x);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = ld(p[i]);
  }
}
template <bool PACKED, int N, typename T>
__device__ __forceinline__ void store_as(T* p, const float (&x)[N]) {
  if constexpr (PACKED) {
    store(p, x);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = st<T>(x[i]);
  }
}
// Whether rows of d elements at these bases (pointer, bytes an element) allow packs of n elements:
// row r starts at element r·d, a multiple of n when d is, so the bases decide.
inline bool packs_fit(std::int64_t d, int n, std::initializer_list<std::pair<const void*, std::size_t>> bases) {
  if (d % n != 0) return false;
  for (const auto& [p, elem_bytes] : bases)
    if (reinterpret_cast<std::uintptr_t>(p) % (elem_bytes * static_cast<std::size_t>(n)) != 0) return false;
  return true;
}
// Elements per 16-byte pack, and whether pointers allow packs.
template <typename T>
constexpr int kPack = static_cast<int>(16 / sizeof(T));
inline bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return true;
}

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with T the C++ type of e; kHalf false makes no f16 instance of f (for data that
// is never f16, as gradients) and throws for f16.
template <bool kHalf = true, typename F>
void with_elem(Elem e, F&& f) {
  if (e == Elem::f32) {
    f(Tag<float>{});
  } else if (e == Elem::bf16) {
    f(Tag<__nv_bfloat16>{});
  } else {
    if constexpr (kHalf) {
      if (e == Elem::f16) {
        f(Tag<__half>{});
        return;
      }
    }
    throw std::logic_error(kHalf ? "unknown storage type" : "this data is f32 or bf16, not f16");
  }
}

// Calls f(Tag<TW>{}, Tag<T>{}) with TW the master dtype ew (f32 or bf16) and T the type of e, which
// under bf16 masters is bf16 too (a bf16 model computes in bf16): the pairs that run, and no others.
template <typename F>
void with_wide(Elem ew, Elem e, F&& f) {
  if (ew == Elem::f32) {
    with_elem(e, [&](auto t) { f(Tag<float>{}, t); });
  } else if (ew == Elem::bf16 && e == Elem::bf16) {
    f(Tag<__nv_bfloat16>{}, Tag<__nv_bfloat16>{});
  } else {
    throw std::logic_error("under bf16 masters every operand is bf16");
  }
}

}  // namespace lmscope::cuda
