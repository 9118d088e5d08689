// The tensor-core backward on mma.sync: dK and dV per key tile (with dQ by atomics, or not), and
// the dQ pass that sums dQ over key tiles in a fixed order.
// Part of flash_attention.cu's one translation unit: included there only, in order, so that its
// launchers instantiate these templates and the kernels compile as one unit.
#pragma once

#include "lmscope/backend/cuda/flash/online_softmax.cuh"

namespace lmscope::cuda {
namespace {

// dK and dV of one key tile (16 keys per warp) against every query tile that sees it; with
// ATOMIC_DQ also dQ += dS·K for each query tile, into fp32 dq_accum by atomics.
template <typename E, int D, bool ATOMIC_DQ, bool SPLIT>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkdv_tc(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v,
                           const E* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                           PartOut<E> dk_out, PartOut<E> dv_out, float* __restrict__ dq_accum, int tq, int tk,
                           float scale, bool causal, TileOrder order) {
  constexpr int kSStride = kTileQ + 8;  // dSᵀ tile [keys][queries]
  extern __shared__ __align__(16) unsigned char smem[];
  E* sK = reinterpret_cast<E*>(smem);
  E* sV = sK + kTileK * kStride<D>;
  E* sQ = sV + kTileK * kStride<D>;                               // [2][kTileQ][stride]
  E* sdO = sQ + 2 * kTileQ * kStride<D>;                          // [2][kTileQ][stride]
  E* sdS = sdO + 2 * kTileQ * kStride<D>;                         // [kTileK][kSStride]
  float* sL = reinterpret_cast<float*>(sdS + kTileK * kSStride);  // [2][kTileQ], log2 units
  float* sDelta = sL + 2 * kTileQ;                                // [2][kTileQ]
  const CtaRows cta = key_tile(order, kTileK);
  const int seq = cta.seq, k0 = cta.row0;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const long long qoff = static_cast<long long>(seq) * tq, koff = static_cast<long long>(seq) * tk;
  q += qoff * D, dout += qoff * D, lse += qoff, delta += qoff, dq_accum += qoff * D;
  k += koff * D, v += koff * D;
  const float scale_log2 = scale * kLog2e;

  // Query tiles before the diagonal see none of these keys; this CTA walks its part of the rest.
  const int from = causal ? k0 / kTileQ : 0, all = (tq + kTileQ - 1) / kTileQ;
  const TileRange queries = SPLIT ? part_of(from, all, cta.part, order.parts) : TileRange{from, all};
  const int first = queries.begin, end = queries.end;
  auto load_queries = [&](int i, int buf) {
    load_tile<D, kTileQ, kThreads>(sQ + buf * kTileQ * kStride<D>, q, i * kTileQ, tq, tid);
    load_tile<D, kTileQ, kThreads>(sdO + buf * kTileQ * kStride<D>, dout, i * kTileQ, tq, tid);
    for (int r = tid; r < kTileQ; r += kThreads) {
      const int row = i * kTileQ + r;
      sL[buf * kTileQ + r] = row < tq ? lse[row] * kLog2e : INFINITY;
      sDelta[buf * kTileQ + r] = row < tq ? delta[row] : 0.f;
    }
  };
  load_tile<D, kTileK, kThreads>(sK, k, k0, tk, tid);
  load_tile<D, kTileK, kThreads>(sV, v, k0, tk, tid);
  if (first < end) load_queries(first, 0);
  cp_async_commit();

  float dk_acc[D / 8][4], dv_acc[D / 8][4];
  zero(dk_acc);
  zero(dv_acc);
  const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};

  for (int i = first; i < end; ++i) {
    cp_async_wait_all();
    __syncthreads();
    const int buf = (i - first) % 2;
    if (i + 1 < end) load_queries(i + 1, 1 - buf);
    cp_async_commit();
    const E* cQ = sQ + buf * kTileQ * kStride<D>;
    const E* cdO = sdO + buf * kTileQ * kStride<D>;
    const float* cL = sL + buf * kTileQ;
    const float* cDelta = sDelta + buf * kTileQ;
    const int q0 = i * kTileQ;

    unsigned ka[D / 16][4];
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) load_a<kStride<D>>(ka[kc], sK, warp * 16, kc * 16, lane);
    float p[kTileQ / 8][4];  // Pᵀ: this warp's 16 keys × the tile's queries
    zero(p);
    mma_abt<D, kTileQ, kStride<D>>(p, ka, cQ, lane);
    const bool mask = tile_needs_mask(q0, k0, tq, tk, causal);
#pragma unroll
    for (int nb = 0; nb < kTileQ / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nb * 8 + 2 * t + (e % 2);
        const float x = fast_exp2(fmaf(p[nb][e], scale_log2, -cL[col]));
        p[nb][e] = mask && masked(q0 + col, key[e / 2], tq, tk, causal) ? 0.f : x;
      }
    // dV += Pᵀ·dO
    unsigned pa[kTileQ / 16][4];
#pragma unroll
    for (int kc = 0; kc < kTileQ / 16; ++kc) accumulators_to_a<E>(pa[kc], p[2 * kc], p[2 * kc + 1]);
    mma_ab<kTileQ, D, kStride<D>>(dv_acc, pa, cdO, lane);
    // dPᵀ = V·dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − delta)
    float dp[kTileQ / 8][4];
    zero(dp);
    {
      unsigned va[D / 16][4];
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) load_a<kStride<D>>(va[kc], sV, warp * 16, kc * 16, lane);
      mma_abt<D, kTileQ, kStride<D>>(dp, va, cdO, lane);
    }
#pragma unroll
    for (int nb = 0; nb < kTileQ / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) p[nb][e] *= dp[nb][e] - cDelta[nb * 8 + 2 * t + (e % 2)];
        // dK += dSᵀ·Q
#pragma unroll
    for (int kc = 0; kc < kTileQ / 16; ++kc) accumulators_to_a<E>(pa[kc], p[2 * kc], p[2 * kc + 1]);
    mma_ab<kTileQ, D, kStride<D>>(dk_acc, pa, cQ, lane);

    if constexpr (ATOMIC_DQ) {
      // dQ (this query tile) += dS·K: dSᵀ goes through shared memory to be read transposed.
#pragma unroll
      for (int nb = 0; nb < kTileQ / 8; ++nb)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<unsigned*>(sdS + (warp * 16 + g + 8 * h) * kSStride + nb * 8 + 2 * t) =
              pack2<E>(p[nb][2 * h], p[nb][2 * h + 1]);
      __syncthreads();
      float dq[D / 8][4];
      zero(dq);
#pragma unroll
      for (int kc = 0; kc < kTileK / 16; ++kc) {
        unsigned a[1][4];
        load_a_trans<kSStride>(a[0], sdS, warp * 16, kc * 16, lane);
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
          unsigned f[4];
          load_b_trans<kStride<D>>(f, sK, np * 16, kc * 16, lane);
          mma<E>(dq[2 * np], a[0], f[0], f[1]);
          mma<E>(dq[2 * np + 1], a[0], f[2], f[3]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = q0 + warp * 16 + g + 8 * h;
        if (row >= tq) continue;
        float* dst = dq_accum + static_cast<long long>(row) * D + 2 * t;
#pragma unroll
        for (int nd = 0; nd < D / 8; ++nd) {
          atomicAdd(dst + nd * 8, dq[nd][2 * h] * scale);
          atomicAdd(dst + nd * 8 + 1, dq[nd][2 * h + 1] * scale);
        }
      }
    }
  }

  cp_async_wait_all();  // a causal key tile past the last query loads K and V but runs no step
  const PartOut<E> dk = dk_out.template at<SPLIT>(cta.part, koff * D),
                   dv = dv_out.template at<SPLIT>(cta.part, koff * D);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (key[h] >= tk) continue;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const long long at = static_cast<long long>(key[h]) * D + nd * 8 + 2 * t;
      dk.store2(at, dk_acc[nd][2 * h] * scale, dk_acc[nd][2 * h + 1] * scale);
      dv.store2(at, dv_acc[nd][2 * h], dv_acc[nd][2 * h + 1]);
    }
  }
}

// dQ of one query tile over every key tile it sees, in order: the deterministic path.
template <typename E, int D, bool SPLIT>
__global__ void __launch_bounds__(kThreads, D == 32 ? 4 : 1)  // d 32: 164 registers gave 3 CTAs per SM (step 27)
    flash_backward_dq_tc(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v,
                         const E* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                         PartOut<E> dq_out, int tq, int tk, float scale, bool causal, TileOrder order) {
  extern __shared__ __align__(16) unsigned char smem[];
  E* sQ = reinterpret_cast<E*>(smem);
  E* sdO = sQ + kTileQ * kStride<D>;
  E* sK = sdO + kTileQ * kStride<D>;  // [2][kTileK][stride]
  E* sV = sK + 2 * kTileK * kStride<D>;
  const CtaRows cta = query_tile(order, kTileQ);
  const int seq = cta.seq, q0 = cta.row0;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const long long qoff = static_cast<long long>(seq) * tq, koff = static_cast<long long>(seq) * tk;
  q += qoff * D, dout += qoff * D, lse += qoff, delta += qoff;
  k += koff * D, v += koff * D;
  const float scale_log2 = scale * kLog2e;

  const int kend = causal ? min(tk, q0 + kTileQ) : tk;
  const int all = (kend + kTileK - 1) / kTileK;
  const TileRange keys = SPLIT ? part_of(0, all, cta.part, order.parts) : TileRange{0, all};
  load_tile<D, kTileQ, kThreads>(sQ, q, q0, tq, tid);
  load_tile<D, kTileQ, kThreads>(sdO, dout, q0, tq, tid);
  load_tile<D, kTileK, kThreads>(sK, k, keys.begin * kTileK, tk, tid);
  load_tile<D, kTileK, kThreads>(sV, v, keys.begin * kTileK, tk, tid);
  cp_async_commit();

  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float lrow[2], drow[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    lrow[i] = row[i] < tq ? lse[row[i]] * kLog2e : INFINITY;
    drow[i] = row[i] < tq ? delta[row[i]] : 0.f;
  }
  float acc[D / 8][4];
  zero(acc);
  unsigned qa[D / 16][4], da[D / 16][4];

  for (int j = keys.begin; j < keys.end; ++j) {
    cp_async_wait_all();
    __syncthreads();
    const int buf = (j - keys.begin) % 2;
    if (j + 1 < keys.end) {
      load_tile<D, kTileK, kThreads>(sK + (1 - buf) * kTileK * kStride<D>, k, (j + 1) * kTileK, tk, tid);
      load_tile<D, kTileK, kThreads>(sV + (1 - buf) * kTileK * kStride<D>, v, (j + 1) * kTileK, tk, tid);
    }
    cp_async_commit();
    if (j == keys.begin)
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) {
        load_a<kStride<D>>(qa[kc], sQ, warp * 16, kc * 16, lane);
        load_a<kStride<D>>(da[kc], sdO, warp * 16, kc * 16, lane);
      }
    const E* cK = sK + buf * kTileK * kStride<D>;
    const E* cV = sV + buf * kTileK * kStride<D>;
    const int k0 = j * kTileK;

    float p[kTileK / 8][4], dp[kTileK / 8][4];
    zero(p);
    zero(dp);
    mma_abt<D, kTileK, kStride<D>>(p, qa, cK, lane);
    mma_abt<D, kTileK, kStride<D>>(dp, da, cV, lane);
    const bool mask = tile_needs_mask(q0, k0, tq, tk, causal);
#pragma unroll
    for (int nb = 0; nb < kTileK / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = fast_exp2(fmaf(p[nb][e], scale_log2, -lrow[e / 2]));
        const bool off = mask && masked(row[e / 2], k0 + nb * 8 + 2 * t + (e % 2), tq, tk, causal);
        p[nb][e] = off ? 0.f : x * (dp[nb][e] - drow[e / 2]);
      }
    unsigned sa[kTileK / 16][4];
#pragma unroll
    for (int kc = 0; kc < kTileK / 16; ++kc) accumulators_to_a<E>(sa[kc], p[2 * kc], p[2 * kc + 1]);
    mma_ab<kTileK, D, kStride<D>>(acc, sa, cK, lane);
  }
  cp_async_wait_all();  // an empty part loaded its first tiles and ran no step
  const PartOut<E> dq = dq_out.template at<SPLIT>(cta.part, qoff * D);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row[h] >= tq) continue;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      dq.store2(static_cast<long long>(row[h]) * D + nd * 8 + 2 * t, acc[nd][2 * h] * scale,
                acc[nd][2 * h + 1] * scale);
  }
}

}  // namespace
}  // namespace lmscope::cuda
