// The Hopper forward: two warpgroups of 64 query rows each; keys in tiles of 64 (128 at d 128). The
// copy engine (TMA) puts K and V into swizzled tiles (wgmma.cuh) that wgmma reads straight from
// shared memory; Q is read once into registers as A fragments, and P goes from the S accumulators
// to the A fragments of P·V without leaving registers, as in the mma.sync kernel.
// Part of flash_attention.cu's one translation unit: included there only, in order, so that its
// launchers instantiate these templates and the kernels compile as one unit.
#pragma once

#include "lmscope/backend/cuda/flash/sm90_tiles.cuh"

namespace lmscope::cuda {
namespace {

// Software pipeline per warpgroup: step j issues S_j = Q·K_jᵀ and O += P_{j−1}·V_{j−1} together,
// waits for S_j only, and computes the softmax of tile j while the tensor cores run P_{j−1}·V_{j−1};
// O is rescaled once that product is done. K and V tiles sit in a KeyValueRing, loaded
// kForwardStages − 2 tiles ahead. The steady-state loop has no branch around a wgmma: ptxas serialises
// every wgmma of a kernel where one sits in code it cannot prove warp-uniform, or where an
// accumulator is read before the wait that covers it. So both warpgroups run every key tile of
// the CTA; under a causal mask the first one's last tile (at d 128 its second half) is then fully
// masked and adds nothing.
// At d 32 and 64 two CTAs fit an SM when the kernel keeps to 128 registers (at d 64 ptxas then spills
// 48 bytes): one CTA's softmax runs beside the other's tensor work (d 64, s 16384, b 8: 1.14 → 0.96 ms).
// SPLIT: CTAs walk parts of their tiles (order.parts > 1). Without it, the kernel is compiled with
// none of the parts' bookkeeping: with it, ptxas gave consecutive wgmmas' descriptors the same
// uniform registers, and at d 128 the unsplit forward ran 13% slower (step 25).
template <int D, bool SPLIT>
__global__ void __launch_bounds__(kWgThreads, D <= 64 ? 2 : 1)
    flash_forward_wgmma(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                        const __grid_constant__ CUtensorMap v_map, PartOut<bf16> o_out, PartOut<float> lse_out, int tq,
                        int tk, float scale_log2, bool causal, TileOrder order) {
#ifdef LMSCOPE_WGMMA
  using Tile = sm90::TileOf<D>;
  constexpr int kPanels = sm90::kPanels<D>, kBlocks = Tile::kCols / 8;  // accumulator blocks per panel
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sQ = atom_aligned_smem(smem_raw);
  unsigned char* sK = sQ + kWgTileQ * D * 2;  // the K/V ring
  const CtaRows cta = query_tile(order, kWgTileQ);
  const int seq = cta.seq, q0 = cta.row0;
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wq0 = q0 + wg * 64;  // this warpgroup's first query
  const int row[2] = {wq0 + warp * 16 + g, wq0 + warp * 16 + g + 8};

  constexpr int kTileK = kForwardTileK<D>, kScoreBlocks = kTileK / 8;
  const int kend = causal ? min(tk, q0 + kWgTileQ) : tk;
  const int all = (kend + kTileK - 1) / kTileK;
  const TileRange keys = SPLIT ? part_of(0, all, cta.part, order.parts) : TileRange{0, all};
  // An empty part (of a split light tile) runs one tile with every key masked (as if tk were 0), so
  // that the pipeline below needs no early exit.
  const bool empty = SPLIT && keys.begin == keys.end;
  const int tiles = empty ? 1 : keys.end - keys.begin, tk_seen = empty ? 0 : tk;  // tiles: from keys.begin
  const KeyValueTiles<D, kTileK, kForwardStages<D>> kv{sK, &k_map, &v_map, seq, keys.begin};
  const KeyValueRing<D, kTileK, kForwardStages<D>> ring{kv, kv.bars(), tiles, tid};
  ring.start(kWgTileQ * D * 2, [&](std::uint64_t* bar) { tma_tile<D, kWgTileQ>(sQ, q_map, q0, seq, bar); });

  float acc[kPanels][kBlocks][4] = {};
  float s[kScoreBlocks][4];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, corr[2];
  unsigned qa[D / 16][4], pa[kTileK / 16][4];

  auto issue_s = [&](int j) {  // S = Q·K_jᵀ, one product over the tile's keys per 16 channels
    issue_scores<D>(s, qa, Tile::descriptor(kv.k_tile(j)), kTileK);
  };
  auto issue_pv = [&](int j) {  // acc += P_j·V_j
    const unsigned char* cV = kv.v_tile(j);
#pragma unroll
    for (int kc = 0; kc < kTileK / 16; ++kc)
      sm90::mma_rs_panels<kPanels, Tile::kCols>(acc, pa[kc], Tile::descriptor(cV + kc * 16 * Tile::kRowBytes),
                                                kTileK * Tile::kRowBytes);
    sm90::commit();
  };
  auto softmax = [&](int j) {
    const int k0 = (keys.begin + j) * kTileK;
    if (k0 + kTileK > tk_seen || wq0 + 64 > tq || (causal && k0 + kTileK - 1 > wq0))
      online_softmax<true>(s, m, l, corr, scale_log2, row, k0, t, tq, tk_seen, causal);
    else
      online_softmax<false>(s, m, l, corr, scale_log2, row, k0, t, tq, tk, causal);
  };
  auto rescale_and_take_p = [&] {
    if (needs_rescale(corr))
#pragma unroll
      for (int p = 0; p < kPanels; ++p)
#pragma unroll
        for (int nd = 0; nd < kBlocks; ++nd)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[p][nd][e] *= corr[e / 2];
#pragma unroll
    for (int kc = 0; kc < kTileK / 16; ++kc) accumulators_to_a<bf16>(pa[kc], s[2 * kc], s[2 * kc + 1]);
  };

  ring.wait(0);
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc)
    ldmatrix_x4(qa[kc], sQ + Tile::offset(wg * 64 + warp * 16 + lane % 16, 2 * kc + lane / 16, kWgTileQ));
  sm90::fence();
  issue_s(0);
  ring.advance(0);
  sm90::wait<0>();
  sm90::hold(s);
  softmax(0);
  rescale_and_take_p();
  for (int j = 1; j < tiles; ++j) {
    ring.wait(j);
    sm90::fence();
    issue_s(j);
    issue_pv(j - 1);
    ring.advance(j);
    sm90::wait<1>();  // the scores are in; P_{j−1}·V_{j−1} may still run
    sm90::hold(s);
    softmax(j);
    sm90::wait<0>();
    sm90::hold(pa);
#pragma unroll
    for (int p = 0; p < kPanels; ++p) sm90::hold(acc[p]);
    ring.release(j - 1);
    rescale_and_take_p();
  }
  sm90::fence();
  issue_pv(tiles - 1);
  sm90::wait<0>();
#pragma unroll
  for (int p = 0; p < kPanels; ++p) sm90::hold(acc[p]);

  const PartOut<bf16> o = o_out.at<SPLIT>(cta.part, static_cast<long long>(seq) * tq * D);
  const PartOut<float> lse = lse_out.at<SPLIT>(cta.part, static_cast<long long>(seq) * tq);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] = quad_sum(l[i]);
    if (row[i] >= tq) continue;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
#pragma unroll
    for (int p = 0; p < kPanels; ++p)
#pragma unroll
      for (int nd = 0; nd < kBlocks; ++nd)
        o.store2(static_cast<long long>(row[i]) * D + p * Tile::kCols + nd * 8 + 2 * t, acc[p][nd][2 * i] * inv,
                 acc[p][nd][2 * i + 1] * inv);
    if (t == 0) lse.store(row[i], m[i] * kLn2 + logf(l[i]));
  }
#endif
}

}  // namespace
}  // namespace lmscope::cuda
