// The CUDA-core path (fp32 storage, or a head dim without tensor-core kernels): the same tiling in
// plain fp32 arithmetic, four threads per row; and delta = rowsum(dO∘O), which every backward runs
// first.
// Part of flash_attention.cu's one translation unit: included there only, in order, so that its
// launchers instantiate these templates and the kernels compile as one unit.
#pragma once

#include "lmscope/backend/cuda/flash/ptx.cuh"
#include "lmscope/device/tile_order.h"

namespace lmscope::cuda {
namespace {

// Four threads per row (a quad: lanes 4r..4r+3), 32 rows per CTA, 32-wide tiles staged as fp32 in
// shared memory [32][d + 1] (the +1 spreads a column over the banks). Thread s of a quad owns the
// keys (or queries) s, s + 4, ... of a tile and the channels s, s + 4, ... of the outputs.
constexpr int kSimtRows = 32, kSimtThreads = 4 * kSimtRows, kSimtMaxD = 128;

template <typename T>
__device__ __forceinline__ void load_rows_f32(float* tile, const T* src, int r0, int total, int d, int tid) {
  for (int i = tid; i < kSimtRows * d; i += kSimtThreads) {
    const int r = i / d, c = i % d;
    tile[r * (d + 1) + c] = r0 + r < total ? ld(src[static_cast<long long>(r0 + r) * d + c]) : 0.f;
  }
}
__device__ __forceinline__ float row_dot(const float* a, const float* b, int d) {
  float s = 0.f;
  for (int c = 0; c < d; ++c) s = fmaf(a[c], b[c], s);
  return s;
}

template <typename T>
__global__ void __launch_bounds__(kSimtThreads)
    flash_forward_simt(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                       float* __restrict__ lse, int tq, int tk, int d, float scale_log2, bool causal, TileOrder order) {
  extern __shared__ float fsm[];
  const int rs = d + 1;
  float *sQ = fsm, *sK = sQ + kSimtRows * rs, *sV = sK + kSimtRows * rs, *sP = sV + kSimtRows * rs;
  const CtaRows cta = query_tile(order, kSimtRows);  // one part: the CUDA-core path is not split
  const int seq = cta.seq, q0 = cta.row0;
  const int tid = threadIdx.x, r = tid / 4, s = tid % 4, row = q0 + r;
  q += static_cast<long long>(seq) * tq * d, o += static_cast<long long>(seq) * tq * d;
  k += static_cast<long long>(seq) * tk * d, v += static_cast<long long>(seq) * tk * d;
  lse += static_cast<long long>(seq) * tq;
  load_rows_f32(sQ, q, q0, tq, d, tid);
  float acc[kSimtMaxD / 4] = {};
  float m = -INFINITY, l = 0.f;
  const int kend = causal ? min(tk, q0 + kSimtRows) : tk;
  for (int k0 = 0; k0 < kend; k0 += kSimtRows) {
    __syncthreads();
    load_rows_f32(sK, k, k0, tk, d, tid);
    load_rows_f32(sV, v, k0, tk, d, tid);
    __syncthreads();
    float sc[kSimtRows / 4], mx = m;
#pragma unroll
    for (int u = 0; u < kSimtRows / 4; ++u) {
      const int key = k0 + s + 4 * u;
      sc[u] =
          masked(row, key, tq, tk, causal) ? -INFINITY : row_dot(sQ + r * rs, sK + (s + 4 * u) * rs, d) * scale_log2;
      mx = fmaxf(mx, sc[u]);
    }
    mx = quad_max(mx);
    const float base = mx == -INFINITY ? 0.f : mx, corr = exp2f(m - base);
    m = mx;
    l *= corr;
#pragma unroll
    for (int u = 0; u < kSimtRows / 4; ++u) {
      const float p = exp2f(sc[u] - base);
      l += p;
      sP[r * (kSimtRows + 1) + s + 4 * u] = p;
    }
    __syncwarp();
#pragma unroll
    for (int w = 0; w < kSimtMaxD / 4; ++w) {
      const int c = s + 4 * w;
      if (c >= d) break;
      float a = acc[w] * corr;
      for (int key = 0; key < kSimtRows; ++key) a = fmaf(sP[r * (kSimtRows + 1) + key], sV[key * rs + c], a);
      acc[w] = a;
    }
  }
  l = quad_sum(l);
  if (row >= tq) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int w = 0; w < kSimtMaxD / 4; ++w)
    if (s + 4 * w < d) o[static_cast<long long>(row) * d + s + 4 * w] = st<T>(acc[w] * inv);
  if (s == 0) lse[row] = m * kLn2 + logf(l);
}

// dK and dV of 32 keys (a quad per key) against every query tile that sees them.
template <typename T>
__global__ void __launch_bounds__(kSimtThreads)
    flash_backward_dkdv_simt(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                             const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                             T* __restrict__ dk, T* __restrict__ dv, int tq, int tk, int d, float scale, bool causal,
                             TileOrder order) {
  extern __shared__ float fsm[];
  const int rs = d + 1, pld = kSimtRows + 1;
  float *sK = fsm, *sV = sK + kSimtRows * rs, *sQ = sV + kSimtRows * rs, *sdO = sQ + kSimtRows * rs;
  float *sP = sdO + kSimtRows * rs, *sdS = sP + kSimtRows * pld, *sL = sdS + kSimtRows * pld, *sD = sL + kSimtRows;
  const CtaRows cta = key_tile(order, kSimtRows);  // one part: the CUDA-core path is not split
  const int seq = cta.seq, k0 = cta.row0;
  const int tid = threadIdx.x, r = tid / 4, s = tid % 4, key = k0 + r;
  const long long qoff = static_cast<long long>(seq) * tq, koff = static_cast<long long>(seq) * tk;
  q += qoff * d, dout += qoff * d, lse += qoff, delta += qoff;
  k += koff * d, v += koff * d, dk += koff * d, dv += koff * d;
  const float scale_log2 = scale * kLog2e;
  load_rows_f32(sK, k, k0, tk, d, tid);
  load_rows_f32(sV, v, k0, tk, d, tid);
  float dk_acc[kSimtMaxD / 4] = {}, dv_acc[kSimtMaxD / 4] = {};
  for (int q0 = causal ? k0 / kSimtRows * kSimtRows : 0; q0 < tq; q0 += kSimtRows) {
    __syncthreads();
    load_rows_f32(sQ, q, q0, tq, d, tid);
    load_rows_f32(sdO, dout, q0, tq, d, tid);
    if (tid < kSimtRows) {
      sL[tid] = q0 + tid < tq ? lse[q0 + tid] * kLog2e : INFINITY;
      sD[tid] = q0 + tid < tq ? delta[q0 + tid] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kSimtRows / 4; ++u) {
      const int qi = s + 4 * u;
      float p = 0.f, ds = 0.f;
      if (!masked(q0 + qi, key, tq, tk, causal)) {
        p = exp2f(row_dot(sK + r * rs, sQ + qi * rs, d) * scale_log2 - sL[qi]);
        ds = p * (row_dot(sV + r * rs, sdO + qi * rs, d) - sD[qi]);
      }
      sP[r * pld + qi] = p;
      sdS[r * pld + qi] = ds;
    }
    __syncwarp();
#pragma unroll
    for (int w = 0; w < kSimtMaxD / 4; ++w) {
      const int c = s + 4 * w;
      if (c >= d) break;
      float a = dv_acc[w], b = dk_acc[w];
      for (int qi = 0; qi < kSimtRows; ++qi) {
        a = fmaf(sP[r * pld + qi], sdO[qi * rs + c], a);
        b = fmaf(sdS[r * pld + qi], sQ[qi * rs + c], b);
      }
      dv_acc[w] = a, dk_acc[w] = b;
    }
  }
  if (key >= tk) return;
#pragma unroll
  for (int w = 0; w < kSimtMaxD / 4; ++w)
    if (s + 4 * w < d) {
      dk[static_cast<long long>(key) * d + s + 4 * w] = st<T>(dk_acc[w] * scale);
      dv[static_cast<long long>(key) * d + s + 4 * w] = st<T>(dv_acc[w]);
    }
}

// dQ of 32 queries over every key tile they see.
template <typename T>
__global__ void __launch_bounds__(kSimtThreads)
    flash_backward_dq_simt(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                           const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                           T* __restrict__ dq, int tq, int tk, int d, float scale, bool causal, TileOrder order) {
  extern __shared__ float fsm[];
  const int rs = d + 1, pld = kSimtRows + 1;
  float *sQ = fsm, *sdO = sQ + kSimtRows * rs, *sK = sdO + kSimtRows * rs, *sV = sK + kSimtRows * rs;
  float* sdS = sV + kSimtRows * rs;
  const CtaRows cta = query_tile(order, kSimtRows);  // one part: the CUDA-core path is not split
  const int seq = cta.seq, q0 = cta.row0;
  const int tid = threadIdx.x, r = tid / 4, s = tid % 4, row = q0 + r;
  const long long qoff = static_cast<long long>(seq) * tq, koff = static_cast<long long>(seq) * tk;
  q += qoff * d, dout += qoff * d, dq += qoff * d, lse += qoff, delta += qoff;
  k += koff * d, v += koff * d;
  const float scale_log2 = scale * kLog2e;
  load_rows_f32(sQ, q, q0, tq, d, tid);
  load_rows_f32(sdO, dout, q0, tq, d, tid);
  const float lrow = row < tq ? lse[row] * kLog2e : INFINITY, drow = row < tq ? delta[row] : 0.f;
  float acc[kSimtMaxD / 4] = {};
  const int kend = causal ? min(tk, q0 + kSimtRows) : tk;
  for (int k0 = 0; k0 < kend; k0 += kSimtRows) {
    __syncthreads();
    load_rows_f32(sK, k, k0, tk, d, tid);
    load_rows_f32(sV, v, k0, tk, d, tid);
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kSimtRows / 4; ++u) {
      const int kj = s + 4 * u;
      float ds = 0.f;
      if (!masked(row, k0 + kj, tq, tk, causal)) {
        const float p = exp2f(row_dot(sQ + r * rs, sK + kj * rs, d) * scale_log2 - lrow);
        ds = p * (row_dot(sdO + r * rs, sV + kj * rs, d) - drow);
      }
      sdS[r * pld + kj] = ds;
    }
    __syncwarp();
#pragma unroll
    for (int w = 0; w < kSimtMaxD / 4; ++w) {
      const int c = s + 4 * w;
      if (c >= d) break;
      float a = acc[w];
      for (int kj = 0; kj < kSimtRows; ++kj) a = fmaf(sdS[r * pld + kj], sK[kj * rs + c], a);
      acc[w] = a;
    }
  }
  if (row >= tq) return;
#pragma unroll
  for (int w = 0; w < kSimtMaxD / 4; ++w)
    if (s + 4 * w < d) dq[static_cast<long long>(row) * d + s + 4 * w] = st<T>(acc[w] * scale);
}

// delta[row] = Σ dO∘O over the row: one warp per row of each sequence's `padded` rows (tq rounded up
// where stats is given, else tq). With stats (the Hopper dK/dV kernel's [2, n, padded] copy) the warp
// also writes stats[0][seq][r] = delta and stats[1][seq][r] = L·log2 e, and 0 for the rows that pad
// tq (masked queries; finite, so that P = 0 stays 0 in dS = P·(dP − delta)).
template <typename T>
__global__ void flash_delta(const T* __restrict__ out, const T* __restrict__ dout, const float* __restrict__ lse,
                            float* __restrict__ delta, float* __restrict__ stats, long long n, long long tq,
                            long long padded, int d) {
  const long long i = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (i >= n * padded) return;
  const long long seq = i / padded, r = i % padded, row = seq * tq + r;
  const bool real = r < tq, lead = threadIdx.x % 32 == 0;
  float s = 0.f;
  if (real)
    for (int c = threadIdx.x % 32; c < d; c += 32) s += ld(out[row * d + c]) * ld(dout[row * d + c]);
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (!lead) return;
  if (real) delta[row] = s;
  if (stats) {
    stats[i] = s;
    stats[n * padded + i] = real ? lse[row] * kLog2e : 0.f;
  }
}

// flash_delta's values by 16-byte loads: LANES lanes a row (LANES·VEC ≥ d, VEC elements a lane),
// 32/LANES rows a warp, each lane's products summed in order and then across the row's lanes. One
// warp a row, one element a lane, read 128 bytes of a d 64 row at a time and ran at 39% of the
// memory's rate (H100, large ctx 1024: 18.8 µs a call for 22 MB); for rows of whole 16-byte packs.
template <typename T, int LANES>
__global__ void flash_delta_packed(const T* __restrict__ out, const T* __restrict__ dout, const float* __restrict__ lse,
                                   float* __restrict__ delta, float* __restrict__ stats, long long n, long long tq,
                                   long long padded, int d) {
  constexpr int kVec = 16 / sizeof(T);
  const int lane = threadIdx.x % 32, col = (lane % LANES) * kVec;
  const long long i =
      (static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32) * (32 / LANES) + lane / LANES;
  const bool in = i < n * padded;
  const long long seq = i / padded, r = i % padded, row = seq * tq + r;
  const bool real = in && r < tq;
  float s = 0.f;
  if (real && col < d) {
    float o[kVec], g[kVec];
    load(out + row * d + col, o);
    load(dout + row * d + col, g);
#pragma unroll
    for (int k = 0; k < kVec; ++k) s += o[k] * g[k];
  }
#pragma unroll
  for (int off = LANES / 2; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (!in || lane % LANES != 0) return;
  if (real) delta[row] = s;
  if (stats) {
    stats[i] = s;
    stats[n * padded + i] = real ? lse[row] * kLog2e : 0.f;
  }
}

}  // namespace
}  // namespace lmscope::cuda
