// The tensor-core forward on mma.sync (sm_80 and later, E = bf16 or half, head dims 16 to 128): a warp owns 16
// query rows, K and V tiles double-buffered by cp.async, P kept in registers for P·V.
// Part of flash_attention.cu's one translation unit: included there only, in order, so that its
// launchers instantiate these templates and the kernels compile as one unit.
#pragma once

#include "lmscope/backend/cuda/flash/online_softmax.cuh"

namespace lmscope::cuda {
namespace {

template <typename E, int D, bool SPLIT>
__global__ void __launch_bounds__(kThreads)
    flash_forward_tc(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v, PartOut<E> o_out,
                     PartOut<float> lse_out, int tq, int tk, float scale_log2, bool causal, TileOrder order) {
  extern __shared__ __align__(16) unsigned char smem[];
  E* sQ = reinterpret_cast<E*>(smem);
  E* sK = sQ + kTileQ * kStride<D>;  // [2][kTileK][stride]
  E* sV = sK + 2 * kTileK * kStride<D>;
  const CtaRows cta = query_tile(order, kTileQ);
  const int seq = cta.seq, q0 = cta.row0;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  q += static_cast<long long>(seq) * tq * D;
  k += static_cast<long long>(seq) * tk * D;
  v += static_cast<long long>(seq) * tk * D;

  const int kend = causal ? min(tk, q0 + kTileQ) : tk;
  const int all = (kend + kTileK - 1) / kTileK;
  const TileRange keys = SPLIT ? part_of(0, all, cta.part, order.parts) : TileRange{0, all};
  load_tile<D, kTileQ, kThreads>(sQ, q, q0, tq, tid);
  load_tile<D, kTileK, kThreads>(sK, k, keys.begin * kTileK, tk, tid);
  load_tile<D, kTileK, kThreads>(sV, v, keys.begin * kTileK, tk, tid);
  cp_async_commit();

  float acc[D / 8][4];
  zero(acc);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  unsigned qa[D / 16][4];
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};

  for (int j = keys.begin; j < keys.end; ++j) {
    cp_async_wait_all();
    __syncthreads();  // tile j is in; every warp is done with tile j − 1's buffer
    const int buf = (j - keys.begin) % 2;
    if (j + 1 < keys.end) {
      load_tile<D, kTileK, kThreads>(sK + (1 - buf) * kTileK * kStride<D>, k, (j + 1) * kTileK, tk, tid);
      load_tile<D, kTileK, kThreads>(sV + (1 - buf) * kTileK * kStride<D>, v, (j + 1) * kTileK, tk, tid);
    }
    cp_async_commit();
    if (j == keys.begin)
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) load_a<kStride<D>>(qa[kc], sQ, warp * 16, kc * 16, lane);
    const E* cK = sK + buf * kTileK * kStride<D>;
    const E* cV = sV + buf * kTileK * kStride<D>;
    const int k0 = j * kTileK;

    float s[kTileK / 8][4];
    zero(s);
    mma_abt<D, kTileK, kStride<D>>(s, qa, cK, lane);

    float corr[2];
    if (tile_needs_mask(q0, k0, tq, tk, causal))
      online_softmax<true>(s, m, l, corr, scale_log2, row, k0, t, tq, tk, causal);
    else
      online_softmax<false>(s, m, l, corr, scale_log2, row, k0, t, tq, tk, causal);
    if (needs_rescale(corr))
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nd][e] *= corr[e / 2];
    unsigned pa[kTileK / 16][4];
#pragma unroll
    for (int kc = 0; kc < kTileK / 16; ++kc) accumulators_to_a<E>(pa[kc], s[2 * kc], s[2 * kc + 1]);
    mma_ab<kTileK, D, kStride<D>>(acc, pa, cV, lane);
  }
  cp_async_wait_all();  // an empty part loaded its first tiles and ran no step

  // The outputs are made here, not at the top: held through the loop, they cost registers there.
  const PartOut<E> o = o_out.template at<SPLIT>(cta.part, static_cast<long long>(seq) * tq * D);
  const PartOut<float> lse = lse_out.template at<SPLIT>(cta.part, static_cast<long long>(seq) * tq);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] = quad_sum(l[i]);
    if (row[i] >= tq) continue;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      o.store2(static_cast<long long>(row[i]) * D + nd * 8 + 2 * t, acc[nd][2 * i] * inv, acc[nd][2 * i + 1] * inv);
    if (t == 0) lse.store(row[i], m[i] * kLn2 + logf(l[i]));  // −∞ for a row that saw no key
  }
}

}  // namespace
}  // namespace lmscope::cuda
