// The mma.sync kernels' tile shapes and masks, the online softmax of a warp's 16 rows, which
// tile and part a CTA takes (tile_order.h), and where a kernel's results go (the output, or its
// part's slice of a workspace).
// Part of flash_attention.cu's one translation unit: included there only, in order, so that its
// launchers instantiate these templates and the kernels compile as one unit.
#pragma once

#include "lmscope/backend/cuda/flash/ptx.cuh"
#include "lmscope/device/tile_order.h"

namespace lmscope::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kTileQ = 16 * kWarps;  // queries per CTA tile: 16 per warp
constexpr int kTileK = 64;           // keys per tile

// Whether the tile [q0, q0 + kTileQ) × [k0, k0 + kTileK) has any masked element.
__device__ __forceinline__ bool tile_needs_mask(int q0, int k0, int tq, int tk, bool causal) {
  return k0 + kTileK > tk || q0 + kTileQ > tq || (causal && k0 + kTileK - 1 > q0);
}
__device__ __forceinline__ bool masked(int query, int key, int tq, int tk, bool causal) {
  return key >= tk || query >= tq || (causal && key > query);
}

// 2^x in one MUFU instruction (exp2f adds range handling around it); 2^−∞ = 0. Tensor-core paths
// only: their inputs are bf16, far coarser than its 2-ulp error.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// How far (log2 units) a row's scores may rise above its running max before the max is moved: P
// then reaches at most 2^8, which bf16 and the fp32 sums hold exactly as well as values below 1,
// and the output rows need rescaling only in the rare tile that moves a max (see needs_rescale).
constexpr float kMaxGrowth = 8.f;

// Online softmax of a warp's 16 rows × 64 keys of raw scores s (m16n8 accumulator blocks: rows g and
// g + 8, keys k0 + 8·nb + 2t + {0, 1}). On return s holds P relative to the running max m (in log2
// units of scaled scores), l is updated, and corr is the factor the output rows must be scaled by:
// 1 unless this tile moved the max (by more than kMaxGrowth). The max is taken on raw scores (the
// scale is positive) so that one FFMA per element scales and shifts; MASK=false, the common tile,
// has no per-element mask test at all.
template <bool MASK, int NB = 8>
__device__ __forceinline__ void online_softmax(float (&s)[NB][4], float (&m)[2], float (&l)[2], float (&corr)[2],
                                               float scale_log2, const int (&row)[2], int k0, int t, int tq, int tk,
                                               bool causal) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (MASK && masked(row[e / 2], k0 + nb * 8 + 2 * t + (e % 2), tq, tk, causal)) s[nb][e] = -INFINITY;
      mx[e / 2] = fmaxf(mx[e / 2], s[nb][e]);
    }
  float shift[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float seen = quad_max(mx[i]) * scale_log2;
    const float mnew = seen > m[i] + kMaxGrowth ? seen : m[i];  // −∞ + 8 = −∞: the first scores set it
    const float base = mnew == -INFINITY ? 0.f : mnew;          // a row with nothing seen yet stays at zero
    corr[i] = mnew == m[i] ? 1.f : fast_exp2(m[i] - base);
    m[i] = mnew;
    l[i] *= corr[i];
    shift[i] = -base;
  }
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nb][e] = fast_exp2(fmaf(s[nb][e], scale_log2, shift[e / 2]));
      l[e / 2] += s[nb][e];
    }
}

// Whether any row of the warp must rescale its output after online_softmax: a warp-uniform test, so
// that the usual tile skips the multiplies as a whole warp.
__device__ __forceinline__ bool needs_rescale(const float (&corr)[2]) {
  return __any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f);
}

// This CTA's sequence, first row and part (tile_order.h), over tiles of `rows` queries (the last
// tile is the heaviest) or keys (the first is).
struct CtaRows {
  int seq, row0, part;
};
__device__ __forceinline__ CtaRows query_tile(const TileOrder& order, int rows) {
  const CtaTile c = order.at(static_cast<int>(blockIdx.x));
  return {c.seq, (order.tiles - 1 - c.rank) * rows, c.part};
}
__device__ __forceinline__ CtaRows key_tile(const TileOrder& order, int rows) {
  const CtaTile c = order.at(static_cast<int>(blockIdx.x));
  return {c.seq, c.rank * rows, c.part};
}

// Where a kernel's results go: the output itself, or, when the CTA walks one part of its tile's inner
// loop (order.parts > 1), that part's slice of an fp32 workspace [parts][slice], which add_parts or
// combine_parts then turn into the output. A part writes what the whole loop would, over its tiles.
template <typename T>
struct PartOut {
  T* out;
  float* parts;     // null: one part, straight to out
  long long slice;  // elements per part
  // SPLIT false: the caller was compiled for one part, and stores go straight to out.
  template <bool SPLIT = true>
  __device__ __forceinline__ PartOut at(int part, long long offset) const {
    return {out + offset, SPLIT && parts ? parts + part * slice + offset : nullptr, slice};
  }
  __device__ __forceinline__ void store2(long long i, float x, float y) const {  // 16-bit outputs
    if (parts)
      *reinterpret_cast<float2*>(parts + i) = make_float2(x, y);
    else
      store_pair(out + i, x, y);
  }
  __device__ __forceinline__ void store(long long i, float x) const {  // fp32 outputs (lse)
    if (parts)
      parts[i] = x;
    else
      out[i] = x;
  }
};

}  // namespace
}  // namespace lmscope::cuda
