// The Hopper backward: dK and dV per 128 keys on wgmma (dQ by bulk atomics into tiles, or not),
// dQ from those tiles, and the Hopper dQ pass that sums dQ over key tiles in a fixed order.
// Part of flash_attention.cu's one translation unit: included there only, in order, so that its
// launchers instantiate these templates and the kernels compile as one unit.
#pragma once

#include "lmscope/backend/cuda/flash/sm90_tiles.cuh"

namespace lmscope::cuda {
namespace {

// One CTA per 128 keys: two warpgroups of 64 keys each, over query tiles of 64 rows (Q, dO, L and
// delta in a TmaRing of QueryTiles, handed over by mbarriers). Per query tile each warpgroup issues
// Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (both operands in shared memory), turns Sᵀ into Pᵀ while dPᵀ runs,
// issues dV += Pᵀ·dO, turns dPᵀ into dSᵀ while that runs, and issues dK += dSᵀ·Q (A operands from
// registers, as P in the forward).
// With ATOMIC_DQ both warpgroups also put dSᵀ in shared memory (two buffers), and dQ = dS·K over
// the CTA's 128 keys (wgmma reading dS transposed) goes to a shared fp32 tile (two buffers), which one
// thread hands to the copy engine: its bulk reduction adds the tile to dq_accum in L2 while the
// warpgroups go on, and no thread waits on global memory (step 22 in docs/log/flash-attention.md: 8-byte
// atomics from every thread at the end of each tile made the backward 8% slower at d 64).
// - d 128 (kDqAlternating, step 46): one warpgroup computes a tile's whole dQ, warpgroup r % 2 for
//   tile r, into the registers that Sᵀ and dPᵀ held, while the other goes straight on to the next
//   tile. So the two run out of step, and one's exponentials run beside the other's products; they
//   meet only where data passes (named barriers: dSᵀ in, dSᵀ buffer free), and the ring's slots are
//   freed by mbarriers, refilled by the dQ warpgroup, the later one. cuDNN's backward (seen under
//   ncu, d73727d) gives dQ to one warpgroup too.
// - d 32 and 64 (kDqHalves, step 37), where that was 7-16% slower: both warpgroups meet at a CTA
//   barrier per tile, then each issues half of the tile before's dQ columns ahead of the tile's Sᵀ,
//   stages them while Sᵀ runs, and only then issues dPᵀ; thread 0 hands the staged tile over in the
//   tile after, past its first products.
// dq_accum holds, per sequence and 64-query tile, the tile's 64 × D values in the order the
// threads' accumulators hold them (dq_tile_index), so every thread writes whole 16-byte runs.
constexpr int kWbKeys = 128, kWbTileQ = 64;
static_assert(kWbTileQ == 64 && kWgTileK == 64, "issue_product multiplies by 64-row tiles");
// Ring slots: kWgStages, loading two tiles ahead; with ATOMIC_DQ, where a slot is refilled as soon
// as both warpgroups are done with it, 3 at d 32 and 64 and 2 at d 128, which leaves room for the
// dSᵀ and dQ tiles.
template <int D, bool ATOMIC_DQ>
constexpr int kWbStages = ATOMIC_DQ ? (D <= 64 ? 3 : 2) : kWgStages;
template <int D, bool ATOMIC_DQ>
constexpr int kWbAhead = ATOMIC_DQ ? kWbStages<D, ATOMIC_DQ> - 1 : kWgStages - 2;

// The query tiles the Hopper backward walks (STAGES slots of Q, then of dO, each 64 queries, and of
// their L and delta rows): query tile `first` + r of sequence `seq` is tile r.
#ifdef LMSCOPE_WGMMA
template <int D, int STAGES>
struct QueryTiles {
  static constexpr int kTileBytes = kWbTileQ * D * 2, kBytes = 2 * kTileBytes + 2 * kWbTileQ * 4;
  unsigned char* q_tiles;  // [STAGES] Q tiles, then [STAGES] dO tiles
  float* rows;             // [STAGES] L rows, then [STAGES] delta rows
  const CUtensorMap* q_map;
  const CUtensorMap* dout_map;
  const CUtensorMap* lse_map;
  const CUtensorMap* delta_map;
  int seq, first;

  __device__ __forceinline__ unsigned char* q_tile(int r) const { return q_tiles + (r % STAGES) * kTileBytes; }
  __device__ __forceinline__ unsigned char* do_tile(int r) const { return q_tile(r) + STAGES * kTileBytes; }
  __device__ __forceinline__ float* lse_row(int r) const { return rows + (r % STAGES) * kWbTileQ; }
  __device__ __forceinline__ float* delta_row(int r) const { return lse_row(r) + STAGES * kWbTileQ; }
  __device__ __forceinline__ void copy(int r, std::uint64_t* bar) const {
    const int q0 = (first + r) * kWbTileQ;
    tma_tile<D, kWbTileQ>(q_tile(r), *q_map, q0, seq, bar);
    tma_tile<D, kWbTileQ>(do_tile(r), *dout_map, q0, seq, bar);
    sm90::tma_load_2d(lse_row(r), *lse_map, q0, seq, bar);
    sm90::tma_load_2d(delta_row(r), *delta_map, q0, seq, bar);
  }
};
#endif

template <int D, bool ATOMIC_DQ>
constexpr int wgmma_backward_smem() {
  constexpr int stages = kWbStages<D, ATOMIC_DQ>;
  return (2 * kWbKeys + 2 * stages * kWbTileQ) * D * 2 + (ATOMIC_DQ ? 2 * kWbKeys * kWbTileQ * 2 : 0) +
         (ATOMIC_DQ ? 2 * kWbTileQ * D * 4 : 0) + 2 * stages * kWbTileQ * 4 + ring_barrier_bytes(stages) +
         sm90::kAtomBytes;
}

// Where the Hopper backward leaves dQ's element (row, col) of a 64-query tile in dq_accum, counted
// in floats from the tile's start: 8-column block (col / 8), warp (16 rows), lane (g = row % 8,
// t = column pair), then the four accumulator values (rows r and r + 8, columns c and c + 1).
// (The sm_80 pass compiles no caller.)
[[maybe_unused]] __host__ __device__ constexpr int dq_tile_index(int row, int col) {
  const int warp = row / 16, g = row % 8, t = (col % 8) / 2;
  return (((col / 8) * 4 + warp) * 32 + g * 4 + t) * 4 + ((row % 16) / 8) * 2 + col % 2;
}

// Pᵀ of a warp's 16 keys × 64 queries from raw scores Sᵀ (accumulator layout: keys key[0] and key[1],
// queries q0 + 8·nb + 2t + {0, 1}); lse2 holds those queries' log-sum-exp in log2 units. Masked
// elements become 0; MASK=false, most tiles, tests nothing.
template <bool MASK>
__device__ __forceinline__ void probabilities_t(float (&s)[8][4], const float (&lse2)[8][2], float scale_log2,
                                                const int (&key)[2], int q0, int t, int tq, int tk, bool causal) {
#pragma unroll
  for (int nb = 0; nb < 8; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = fast_exp2(fmaf(s[nb][e], scale_log2, -lse2[nb][e % 2]));
      s[nb][e] = MASK && masked(q0 + nb * 8 + 2 * t + (e % 2), key[e / 2], tq, tk, causal) ? 0.f : x;
    }
}

template <int D, bool ATOMIC_DQ, bool SPLIT>
__global__ void __launch_bounds__(kWgThreads)
    flash_backward_wgmma(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                         const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap dout_map,
                         const __grid_constant__ CUtensorMap lse_map, const __grid_constant__ CUtensorMap delta_map,
                         PartOut<bf16> dk_out, PartOut<bf16> dv_out, float* __restrict__ dq_accum, int tq, int tk,
                         float scale, bool causal, TileOrder order) {
#ifdef LMSCOPE_WGMMA
  using Tile = sm90::TileOf<D>;
  using DsTile = sm90::Swizzled<kWbTileQ * 2>;  // dSᵀ: [kWbKeys][kWbTileQ]
  constexpr int kPanels = sm90::kPanels<D>, kCols = Tile::kCols;
  constexpr int kKeyBytes = kWbKeys * D * 2, kQBytes = kWbTileQ * D * 2;
  constexpr int kStages = kWbStages<D, ATOMIC_DQ>, kAhead = kWbAhead<D, ATOMIC_DQ>;
  constexpr bool kDqAlternating = ATOMIC_DQ && D == 128, kDqHalves = ATOMIC_DQ && !kDqAlternating;
  constexpr int kDsBytes = ATOMIC_DQ ? kWbKeys * kWbTileQ * 2 : 0, kDqBytes = ATOMIC_DQ ? kWbTileQ * D * 4 : 0;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sK = atom_aligned_smem(smem_raw);
  unsigned char* sV = sK + kKeyBytes;
  unsigned char* sQ = sV + kKeyBytes;                         // [kStages] Q tiles, then [kStages] dO tiles
  unsigned char* sdS = sQ + 2 * kStages * kQBytes;            // ATOMIC_DQ: [2] dSᵀ [kWbKeys][kWbTileQ]
  float* sdQ = reinterpret_cast<float*>(sdS + 2 * kDsBytes);  // ATOMIC_DQ: [2] dq_accum tiles
  float* sRows = sdQ + 2 * kDqBytes / 4;                      // [kStages] L rows, then [kStages] delta rows
  const CtaRows cta = key_tile(order, kWbKeys);
  const int seq = cta.seq, k0 = cta.row0;
  const int tid = threadIdx.x, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  // The warpgroup, broadcast from lane 0 so that ptxas sees it warp-uniform: at d 128 the dQ
  // products sit under a branch on it, and ptxas serialises wgmmas under a branch it cannot prove
  // uniform (step 7).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  const int wk0 = k0 + wg * 64;  // this warpgroup's first key
  const long long koff = static_cast<long long>(seq) * tk;
  const float scale_log2 = scale * kLog2e;

  // Query tiles before the diagonal see none of these keys; this CTA walks its part of the rest.
  const int tiles = (tq + kWbTileQ - 1) / kWbTileQ;
  const int from = causal ? k0 / kWbTileQ : 0;
  const TileRange queries = SPLIT ? part_of(from, tiles, cta.part, order.parts) : TileRange{from, tiles};
  const int first = queries.begin, end = queries.end;
  dq_accum += static_cast<long long>(seq) * tiles * kWbTileQ * D;
  const int key[2] = {wk0 + warp * 16 + g, wk0 + warp * 16 + g + 8};
  float dk_acc[kPanels][kCols / 8][4] = {}, dv_acc[kPanels][kCols / 8][4] = {};
  auto write_dk_dv = [&] {
    const PartOut<bf16> dk = dk_out.at<SPLIT>(cta.part, koff * D), dv = dv_out.at<SPLIT>(cta.part, koff * D);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (key[h] >= tk) continue;
#pragma unroll
      for (int p = 0; p < kPanels; ++p)
#pragma unroll
        for (int nb = 0; nb < kCols / 8; ++nb) {
          const long long at = static_cast<long long>(key[h]) * D + p * kCols + nb * 8 + 2 * t;
          dk.store2(at, dk_acc[p][nb][2 * h] * scale, dk_acc[p][nb][2 * h + 1] * scale);
          dv.store2(at, dv_acc[p][nb][2 * h], dv_acc[p][nb][2 * h + 1]);
        }
    }
  };
  if (first >= end) {  // causal keys past the last query (tk > tq): dK = dV = 0, and dQ gets nothing
    write_dk_dv();
    return;
  }
  auto* bars = reinterpret_cast<std::uint64_t*>(sRows + 2 * kStages * kWbTileQ);
  const QueryTiles<D, kStages> qt{sQ, sRows, &q_map, &dout_map, &lse_map, &delta_map, seq, first};
  const TmaRing<kStages, kAhead, kDqHalves, QueryTiles<D, kStages>> ring{qt, bars, end - first, tid};
  ring.start(2 * kKeyBytes, [&](std::uint64_t* bar) {  // this CTA's keys, with the first query tile
    tma_tile<D, kWbKeys>(sK, k_map, k0, seq, bar);
    tma_tile<D, kWbKeys>(sV, v_map, k0, seq, bar);
  });
  if constexpr (kDqAlternating) ring.advance(0);  // every slot: later ones are refilled once released

  // kDqAlternating: the named barriers of the dSᵀ exchange, one per buffer b, which tiles of parity b
  // use, whose dQ warpgroup is b. kDsIn + b completes once both warpgroups' dSᵀ is in (the other
  // warpgroup arrives, the dQ one waits); kDsFree + b once the dQ has read it, so that it may take
  // the tile two on (the dQ warpgroup arrives, the other waits before its next dSᵀ there).
  // kDqStaged + wg: a warpgroup alone, around the staging of its dQ tile.
  constexpr int kDsIn = 1, kDsFree = 3, kDqStaged = 5;
  // dQ columns [n0, n0 + kDqCols) of tile r = dS·K over the CTA's keys: dSᵀ (buffer r % 2) as an
  // M-major A, K as an N-major B (at d 128 both panels as one operand).
  constexpr int kDqCols = !ATOMIC_DQ ? kCols : kDqAlternating ? D : D / 2;  // without ATOMIC_DQ, unused
  const int n0 = kDqAlternating ? 0 : wg * kDqCols;
  float dq[kDqCols / 8][4];
  auto issue_dq = [&](int r) {
    const std::uint64_t ds_desc = DsTile::descriptor(sdS + (r & 1) * kDsBytes);
    std::uint64_t kn_desc = Tile::descriptor(sK + (n0 / kCols) * kWbKeys * Tile::kRowBytes + (n0 % kCols) * 2);
    if constexpr (kDqCols == 2 * kCols) kn_desc = sm90::panels_as_one(kn_desc, kWbKeys * Tile::kRowBytes);
#pragma unroll
    for (int kc = 0; kc < kWbKeys / 16; ++kc)
      sm90::mma_ss<kDqCols, true, true>(dq, sm90::advance(ds_desc, kc * 16 * DsTile::kRowBytes),
                                        sm90::advance(kn_desc, kc * 16 * Tile::kRowBytes), kc > 0);
    sm90::commit();
  };
  // dQ of tile r, once waited for, into its dq_accum tile in shared memory (buffer r % 2), which
  // reduce_dq(r) then hands to the copy engine, after a fence for the async proxy that the caller places.
  auto dq_buffer = [&](int r) { return sdQ + (r & 1) * (kDqBytes / 4); };
  auto stage_dq = [&](int r) {
    float* dst = dq_buffer(r);
#pragma unroll
    for (int nb = 0; nb < kDqCols / 8; ++nb)
      sm90::store_shared_v4(dst + dq_tile_index(warp * 16 + g, n0 + nb * 8 + 2 * t), dq[nb][0], dq[nb][1], dq[nb][2],
                            dq[nb][3]);
  };
  auto reduce_dq = [&](int r) { sm90::bulk_reduce_add(dq_accum + (first + r) * kWbTileQ * D, dq_buffer(r), kDqBytes); };
  // This warpgroup's keys, in each panel.
  const std::uint64_t k_desc = Tile::descriptor(sK + wg * 64 * Tile::kRowBytes),
                      v_desc = Tile::descriptor(sV + wg * 64 * Tile::kRowBytes);

  for (int i = first; i < end; ++i) {
    const int r = i - first, q0 = i * kWbTileQ;
    const int dq_wg = r & 1;  // kDqAlternating: the warpgroup that computes this tile's dQ
    ring.wait(r);             // kDqHalves also: every thread's dSᵀ of the tile before is in, and its dQ before that
    const unsigned char* cQ = qt.q_tile(r);
    const unsigned char* cdO = qt.do_tile(r);

    // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: K-major A and B, 16 channels (32 bytes) per step within a panel.
    const std::uint64_t q_desc = Tile::descriptor(cQ), do_desc = Tile::descriptor(cdO);
    float s[8][4], dp[8][4];
    sm90::fence();
    if constexpr (kDqHalves) issue_dq(r - 1);  // dQ of the tile before (r = 0: of nothing, never staged)
    issue_scores<D>(s, k_desc, kWbKeys, q_desc, kWbTileQ);
    if constexpr (kDqHalves) {
      // Thread 0's copies (the dQ tile staged in the tile before, the next query tile) only now: its
      // warpgroup's first products wait for all four warps, so its warp must not come late (step 41).
      if (tid == 0 && r > 1) reduce_dq(r - 2);
      ring.advance(r);
      sm90::wait<1>();  // dQ of the tile before is in; Sᵀ may still run
      sm90::hold(dq);
      if (r > 0) stage_dq(r - 1);
      sm90::fence();  // dPᵀ may take the registers dq held
    }
    issue_scores<D>(dp, v_desc, kWbKeys, do_desc, kWbTileQ);
    if constexpr (!ATOMIC_DQ) ring.advance(r);
    float lse2[8][2];
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      const float2 l2 = *reinterpret_cast<const float2*>(qt.lse_row(r) + nb * 8 + 2 * t);
      lse2[nb][0] = l2.x, lse2[nb][1] = l2.y;
    }

    sm90::wait<1>();  // Sᵀ is in; dPᵀ may still run
    sm90::hold(s);
    if (q0 + kWbTileQ > tq || wk0 + 64 > tk || (causal && wk0 + 63 > q0))
      probabilities_t<true>(s, lse2, scale_log2, key, q0, t, tq, tk, causal);
    else
      probabilities_t<false>(s, lse2, scale_log2, key, q0, t, tq, tk, causal);
    unsigned pa[kWbTileQ / 16][4], da[kWbTileQ / 16][4];  // apart: wgmma reads them after issue
    issue_product(dv_acc, pa, s, do_desc);                // dV += Pᵀ·dO

    float dlt[8][2];
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      const float2 d2 = *reinterpret_cast<const float2*>(qt.delta_row(r) + nb * 8 + 2 * t);
      dlt[nb][0] = d2.x, dlt[nb][1] = d2.y;
    }
    sm90::wait<1>();  // dPᵀ is in; dV may still run
    sm90::hold(dp);
#pragma unroll
    for (int nb = 0; nb < 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[nb][e] = s[nb][e] * (dp[nb][e] - dlt[nb][e % 2]);  // dSᵀ
    issue_product(dk_acc, da, dp, q_desc);                                              // dK += dSᵀ·Q

    if constexpr (ATOMIC_DQ) {
      // dSᵀ to shared memory (buffer r % 2; the other one is the tile before's). kDqAlternating: once
      // the dQ of tile r − 2 has read it (its own warpgroup waited for that). Fragment da[kc][2·hi + h]
      // is keys row g + 8h, queries 16·kc + 8·hi + 2t + {0, 1}.
      if (kDqAlternating && wg != dq_wg && r >= 2) sm90::named_sync(kDsFree + (r & 1), kWgThreads);
      unsigned char* sds = sdS + (r & 1) * kDsBytes;
#pragma unroll
      for (int kc = 0; kc < kWbTileQ / 16; ++kc)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            *reinterpret_cast<unsigned*>(sds + DsTile::offset(wg * 64 + warp * 16 + g + 8 * h, 2 * kc + hi, kWbKeys) +
                                         4 * t) = da[kc][2 * hi + h];
      sm90::fence_shared_for_async_reads();  // for the dQ products, and (kDqHalves) the dQ staged above
      if (kDqAlternating && wg != dq_wg) sm90::named_arrive(kDsIn + (r & 1), kWgThreads);
      // kDqHalves: the reduction issued this tile read the dQ buffer that the next tile refills.
      if (kDqHalves && tid == 0) sm90::bulk_wait_read<0>();
    }
    sm90::wait<0>();
    sm90::hold(pa);
    sm90::hold(da);
    ring.release(r);
    if (kDqAlternating && wg == dq_wg) {
      // The later warpgroup: its first thread refills the slot just released, and it computes dQ.
      if (tid % 128 == 0) ring.load(r + kStages);
      sm90::named_sync(kDsIn + (r & 1), kWgThreads);
      sm90::fence();
      issue_dq(r);
      sm90::wait<0>();
      sm90::hold(dq);
      sm90::named_arrive(kDsFree + (r & 1), kWgThreads);
      // Its thread's reduction of tile r − 2, the last one from this buffer, has read it.
      if (tid % 128 == 0) sm90::bulk_wait_read<0>();
      sm90::named_sync(kDqStaged + wg, 128);
      stage_dq(r);
      sm90::fence_shared_for_async_reads();
      sm90::named_sync(kDqStaged + wg, 128);
      if (tid % 128 == 0) reduce_dq(r);
    }
  }
  if constexpr (kDqHalves) {        // the last tile's dQ, and the last two reductions
    const int steps = end - first;  // at least one
    __syncthreads();
    sm90::fence();
    issue_dq(steps - 1);
    sm90::wait<0>();
    sm90::hold(dq);
    stage_dq(steps - 1);
    sm90::fence_shared_for_async_reads();
    __syncthreads();
    if (tid == 0) {
      for (int r = max(steps - 2, 0); r < steps; ++r) reduce_dq(r);
      sm90::bulk_wait<0>();
    }
  }
  if constexpr (kDqAlternating) {
    const int steps = end - first;
    // The other warpgroup takes the dQ warpgroup's last two arrivals, so that every barrier completes.
    for (int r = max(steps - 2, 0); r < steps; ++r)
      if (wg != (r & 1)) sm90::named_sync(kDsFree + (r & 1), kWgThreads);
    if (tid % 128 == 0) sm90::bulk_wait<0>();  // the reductions have read shared memory before the CTA ends
  }
#pragma unroll
  for (int p = 0; p < kPanels; ++p) {
    sm90::hold(dk_acc[p]);
    sm90::hold(dv_acc[p]);
  }
  write_dk_dv();
#endif
}

// dq [n, tq, D] bf16 = scale · the Hopper backward's dq_accum (tiles in dq_tile_index's order): one
// thread per four accumulator values, read as one float4.
template <int D>
__global__ void dq_from_tiles(const float* __restrict__ accum, bf16* __restrict__ dq, int tq, int tiles,
                              long long quads, float scale) {
  constexpr int kTileQuads = kWbTileQ * D / 4;
  const long long f = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (f >= quads) return;
  const long long tile = f / kTileQuads;  // seq · tiles + query tile
  const int j = static_cast<int>(f % kTileQuads), lane = j % 32, warp = (j / 32) % 4;
  const int row = static_cast<int>(tile % tiles) * kWbTileQ + warp * 16 + lane / 4,
            col = (j / 128) * 8 + 2 * (lane % 4);
  const float4 x = reinterpret_cast<const float4*>(accum)[f];
  bf16* out = dq + tile / tiles * tq * D + col;
  if (row < tq)
    *reinterpret_cast<__nv_bfloat162*>(out + static_cast<long long>(row) * D) =
        __floats2bfloat162_rn(x.x * scale, x.y * scale);
  if (row + 8 < tq)
    *reinterpret_cast<__nv_bfloat162*>(out + static_cast<long long>(row + 8) * D) =
        __floats2bfloat162_rn(x.z * scale, x.w * scale);
}

// dQ of 128 queries (two warpgroups × 64) over every key tile they see, in order: the deterministic
// dQ on Hopper. Built as the forward is: K and V in the same 4-slot ring; per key tile S = Q·Kᵀ and
// dP = dO·Vᵀ (K-major B), then dQ += dS·K (N-major B), which runs on while the next tile's S and dP
// are issued. At d 128 Q and dO sit in registers as A fragments. At d 32, 64 and 80 wgmma reads them
// from shared memory (at d 64 2% slower): with register fragments at d 64, dq comes out wrong although
// the PTX is right, and the cause is not found (docs/log/flash-attention.md, steps 16 and 20).
template <bool MASK>
__device__ __forceinline__ void probabilities(float (&s)[8][4], const float (&lse2)[2], float scale_log2,
                                              const int (&row)[2], int k0, int t, int tq, int tk, bool causal) {
#pragma unroll
  for (int nb = 0; nb < 8; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = fast_exp2(fmaf(s[nb][e], scale_log2, -lse2[e / 2]));
      s[nb][e] = MASK && masked(row[e / 2], k0 + nb * 8 + 2 * t + (e % 2), tq, tk, causal) ? 0.f : x;
    }
}

template <int D, bool SPLIT>
__global__ void __launch_bounds__(kWgThreads)
    flash_backward_dq_wgmma(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                            const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap dout_map,
                            const float* __restrict__ lse, const float* __restrict__ delta, PartOut<bf16> dq_out,
                            int tq, int tk, float scale, bool causal, TileOrder order) {
#ifdef LMSCOPE_WGMMA
  using Tile = sm90::TileOf<D>;
  constexpr int kPanels = sm90::kPanels<D>, kBlocks = Tile::kCols / 8;  // accumulator blocks per panel
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sQ = atom_aligned_smem(smem_raw);
  unsigned char* sdO = sQ + kWgTileQ * D * 2;
  unsigned char* sK = sdO + kWgTileQ * D * 2;  // the K/V ring
  const CtaRows cta = query_tile(order, kWgTileQ);
  const int seq = cta.seq, q0 = cta.row0;
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wq0 = q0 + wg * 64;  // this warpgroup's first query
  const long long qoff = static_cast<long long>(seq) * tq;
  lse += qoff, delta += qoff;
  const float scale_log2 = scale * kLog2e;
  const int row[2] = {wq0 + warp * 16 + g, wq0 + warp * 16 + g + 8};

  const int kend = causal ? min(tk, q0 + kWgTileQ) : tk;
  const int all = (kend + kWgTileK - 1) / kWgTileK;
  const TileRange keys = SPLIT ? part_of(0, all, cta.part, order.parts) : TileRange{0, all};
  const int tiles = keys.end - keys.begin;  // counted from keys.begin below
  if (SPLIT && tiles == 0) {  // an empty part (of a split light tile): the ring would wait for a tile forever
    const PartOut<bf16> dq = dq_out.at(cta.part, qoff * D);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (row[h] < tq)
        for (int c = 2 * t; c < D; c += 8) dq.store2(static_cast<long long>(row[h]) * D + c, 0.f, 0.f);
    return;
  }
  const KeyValueTiles<D> kv{sK, &k_map, &v_map, seq, keys.begin};
  const KeyValueRing<D> ring{kv, kv.bars(), tiles, tid};
  ring.start(2 * kWgTileQ * D * 2, [&](std::uint64_t* bar) {
    tma_tile<D, kWgTileQ>(sQ, q_map, q0, seq, bar);
    tma_tile<D, kWgTileQ>(sdO, dout_map, q0, seq, bar);
  });

  float lse2[2], drow[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    lse2[i] = row[i] < tq ? lse[row[i]] * kLog2e : INFINITY;
    drow[i] = row[i] < tq ? delta[row[i]] : 0.f;
  }
  float acc[kPanels][kBlocks][4] = {};
#pragma unroll
  for (int p = 0; p < kPanels; ++p) sm90::hold(acc[p]);  // zeroed here, not inside a wgmma stage
  float s[8][4], dp[8][4];
  unsigned qa[D / 16][4], da[D / 16][4], sa[kWgTileK / 16][4];
  constexpr bool kFromShared = D != 128;  // Q and dO as shared-memory operands, qa and da unused

  ring.wait(0);
  if constexpr (!kFromShared)
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
      const int at = Tile::offset(wg * 64 + warp * 16 + lane % 16, 2 * kc + lane / 16, kWgTileQ);
      ldmatrix_x4(qa[kc], sQ + at);
      ldmatrix_x4(da[kc], sdO + at);
    }
  const std::uint64_t q_desc = Tile::descriptor(sQ + wg * 64 * Tile::kRowBytes),
                      do_desc = Tile::descriptor(sdO + wg * 64 * Tile::kRowBytes);
  for (int j = 0; j < tiles; ++j) {
    ring.wait(j);
    const std::uint64_t k_desc = Tile::descriptor(kv.k_tile(j)), v_desc = Tile::descriptor(kv.v_tile(j));
    sm90::fence();
    if constexpr (kFromShared) {
      issue_scores<D>(s, q_desc, kWgTileQ, k_desc, kWgTileK);
      issue_scores<D>(dp, do_desc, kWgTileQ, v_desc, kWgTileK);
    } else {
      issue_scores<D>(s, qa, k_desc, kWgTileK);
      issue_scores<D>(dp, da, v_desc, kWgTileK);
    }
    ring.advance(j);
    sm90::wait<1>();  // the previous tile's dQ and this one's S are in; dP may still run
    sm90::hold(sa);
    sm90::hold(s);
    if (j > 0) ring.release(j - 1);  // its S, dP and dQ are done
    const int k0 = (keys.begin + j) * kWgTileK;
    if (k0 + kWgTileK > tk || wq0 + 64 > tq || (causal && k0 + kWgTileK - 1 > wq0))
      probabilities<true>(s, lse2, scale_log2, row, k0, t, tq, tk, causal);
    else
      probabilities<false>(s, lse2, scale_log2, row, k0, t, tq, tk, causal);
    sm90::wait<0>();
    sm90::hold(dp);
#pragma unroll
    for (int nb = 0; nb < 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nb][e] *= dp[nb][e] - drow[e / 2];  // dS
    issue_product(acc, sa, s, k_desc);                                  // dQ += dS·K
  }
  sm90::wait<0>();
#pragma unroll
  for (int p = 0; p < kPanels; ++p) sm90::hold(acc[p]);
  const PartOut<bf16> dq = dq_out.at<SPLIT>(cta.part, qoff * D);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row[h] >= tq) continue;
#pragma unroll
    for (int p = 0; p < kPanels; ++p)
#pragma unroll
      for (int nb = 0; nb < kBlocks; ++nb)
        dq.store2(static_cast<long long>(row[h]) * D + p * Tile::kCols + nb * 8 + 2 * t, acc[p][nb][2 * h] * scale,
                  acc[p][nb][2 * h + 1] * scale);
  }
#endif
}

}  // namespace
}  // namespace lmscope::cuda
