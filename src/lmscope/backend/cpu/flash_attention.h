// FlashAttention-2 on the CPU (MODEL.md): the same tiled algorithm as the GPU kernels, with tile
// products through BLAS and one OpenMP task per (sequence, tile). Extra memory is O(tile²) per
// thread plus the caller's delta [n, tq]: no [tq, tk] buffer exists at any time.
#pragma once

#include <cstdint>

namespace lmscope::cpu {

// q [n, tq, d], k and v [n, tk, d] -> o [n, tq, d], lse [n, tq]; causal masks key j > query i.
template <typename T>
void flash_attention_forward(const T* q, const T* k, const T* v, T* o, T* lse, std::int64_t n, std::int64_t tq,
                             std::int64_t tk, std::int64_t d, T scale, bool causal);

// delta: scratch [n, tq]. dk and dv are summed per key tile and dq per query tile, each in a fixed
// order, so the result is deterministic.
template <typename T>
void flash_attention_backward(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk,
                              T* dv, T* delta, std::int64_t n, std::int64_t tq, std::int64_t tk, std::int64_t d,
                              T scale, bool causal);

}  // namespace lmscope::cpu
