// What the Hopper kernels share (sm_90a, bf16 at d 32, 64, 80 and 128): warpgroup tile shapes, the
// shared-memory sizes of their rings, TMA tile copies, the products issued from registers, and
// TmaRing, the ring of tiles the copy engine fills and mbarriers hand over.
// Part of flash_attention.cu's one translation unit: included there only, in order, so that its
// launchers instantiate these templates and the kernels compile as one unit.
#pragma once

#include "lmscope/backend/cuda/flash/online_softmax.cuh"
#include "lmscope/backend/cuda/wgmma.cuh"

namespace lmscope::cuda {
namespace {

// Two warpgroups of 64 query rows each; keys in tiles of 64 (128 at d 128). The copy engine (TMA)
// puts K and V into swizzled tiles (wgmma.cuh) that wgmma reads straight from shared memory; Q is
// read once into registers as A fragments, and P goes from the S accumulators to the A fragments
// of P·V without leaving registers, as in the mma.sync kernel.
constexpr int kWgThreads = 256, kWgTileQ = 128, kWgTileK = 64, kWgStages = 4;
// Head dims with Hopper kernels (tiles laid out as sm90::TileOf says), and those whose backward also
// sums dQ by bulk reductions (at d 80 its own pass sums it).
template <int D>
constexpr bool kHopperHeadDim = D == 32 || D == 64 || D == 80 || D == 128;
template <int D>
constexpr bool kHopperAtomicHeadDim = D == 32 || D == 64 || D == 128;
// Shared bytes of a ring's mbarriers (full and empty per slot), and of a K/V ring of STAGES slots
// of ROWS keys: K and V tiles, then the barriers.
constexpr int ring_barrier_bytes(int stages) { return 2 * stages * 8; }
template <int D, int ROWS, int STAGES>
constexpr int key_value_ring_bytes() {
  return 2 * STAGES * ROWS * D * 2 + ring_barrier_bytes(STAGES);
}
// Keys per tile of the Hopper forward, and its K/V ring's slots: at d 128 tiles of 128 keys (S = Q·Kᵀ
// as one n128 product per step of 16 channels since step 42), which spreads each tile's fixed work
// (waits, row maxima, the ring) over twice the products: 7-10% faster from seq 8192, 1-3% slower at
// 2048-4096 (step 35 in docs/log/flash-attention.md); 3 slots fit beside Q, 240 registers without spills.
template <int D>
constexpr int kForwardTileK = D == 128 ? 128 : kWgTileK;
template <int D>
constexpr int kForwardStages = D == 128 ? 3 : kWgStages;

#ifdef LMSCOPE_WGMMA
// Dynamic shared memory, rounded up to the 1024-byte alignment of the swizzle atoms.
__device__ __forceinline__ unsigned char* atom_aligned_smem(unsigned char* smem) {
  const unsigned pad = (sm90::kAtomBytes - smem_addr(smem) % sm90::kAtomBytes) % sm90::kAtomBytes;
  return smem + pad;
}

// acc (+)= X·Y on a warpgroup: X its 64 rows × 64 (accumulator blocks x, packed here into the A
// fragments a, which must stay untouched until a wait covers this product), Y a 64-row swizzled
// tile of N-column panels (TileOf) read as an N-major B, one panel per accumulator.
template <int PANELS, int BLOCKS>
__device__ __forceinline__ void issue_product(float (&acc)[PANELS][BLOCKS][4], unsigned (&a)[4][4],
                                              const float (&x)[8][4], std::uint64_t y_desc) {
  constexpr int N = 8 * BLOCKS, kRowBytes = N * 2;
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) accumulators_to_a<bf16>(a[kc], x[2 * kc], x[2 * kc + 1]);
  sm90::fence();
#pragma unroll
  for (int kc = 0; kc < 4; ++kc)
    sm90::mma_rs_panels<PANELS, N>(acc, a[kc], sm90::advance(y_desc, kc * 16 * kRowBytes), 64 * kRowBytes);
  sm90::commit();
}

// acc = A·Bᵀ over D channels on a warpgroup (scores: 64 rows of A against 64 rows of B), B a K-major
// swizzled tile of b_rows rows in shared memory; A either a K-major tile of a_rows rows there too
// or, in the overload below, this warpgroup's A fragments in registers (against 8·NB rows of B: 128
// in the d 128 forward). One commit group.
template <int D>
__device__ __forceinline__ void issue_scores(float (&acc)[8][4], std::uint64_t a, int a_rows, std::uint64_t b,
                                             int b_rows) {
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc)
    sm90::mma_ss<64, false, false>(acc, sm90::advance(a, sm90::TileOf<D>::k_step(kc, a_rows)),
                                   sm90::advance(b, sm90::TileOf<D>::k_step(kc, b_rows)), kc > 0);
  sm90::commit();
}
template <int D, int NB>
__device__ __forceinline__ void issue_scores(float (&acc)[NB][4], const unsigned (&a)[D / 16][4], std::uint64_t b,
                                             int b_rows) {
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc)
    sm90::mma_rs<false, NB * 8>(acc, a[kc], sm90::advance(b, sm90::TileOf<D>::k_step(kc, b_rows)), kc > 0);
  sm90::commit();
}

// ROWS rows of sequence `seq` from row r0 of the [n, rows, D] tensor of `map` into a swizzled
// [ROWS][D] tile, one box per panel (TileOf), by the copy engine (zeros past the sequence's end).
template <int D, int ROWS>
__device__ __forceinline__ void tma_tile(unsigned char* tile, const CUtensorMap& map, int r0, int seq,
                                         std::uint64_t* bar) {
  using Tile = sm90::TileOf<D>;
#pragma unroll
  for (int p = 0; p < sm90::kPanels<D>; ++p)
    sm90::tma_load_3d(tile + p * ROWS * Tile::kRowBytes, map, p * Tile::kCols, r0, seq, bar);
}

// A ring of STAGES slots in shared memory that the copy engine fills (TMA), AHEAD tiles ahead of
// the step that reads them: `count` tiles, counted from 0, placed and loaded by Tiles (kBytes per
// tile, copy(i, bar) issues tile i's loads into slot i % STAGES). One thread loads: thread 0 in
// start() and advance(). A slot's `full` barrier completes when the bytes it was promised have
// landed (one arrival, the loader's). Without CTA_SYNC its `empty` barrier completes when every
// thread has released its tile, and the loader waits for it before refilling the slot: with AHEAD
// = STAGES − 2 (the forward, the dQ pass, the deterministic backward) that tile was released a step
// before, so it rarely waits; the --atomic-dq backward at d 128 loads STAGES − 1 ahead, by
// load(j + STAGES) from whichever thread is last to release tile j. With CTA_SYNC (the --atomic-dq
// backward at d 32 and 64, whose threads meet once per tile for the dSᵀ exchange anyway) wait() ends
// at that meeting, after which every thread is done with the tile before, whose slot advance() then
// refills: no `empty` arrivals (256 per tile on one word cost the d 32 backward 7%, step 46). Step j
// of a kernel: wait(j), issue the products, advance(j), and release(j') once the products that read
// tile j' are waited for. (Before TMA loads every thread copied its share of each tile by cp.async,
// then waited, fenced and arrived on `full`: step 30 in docs/log/flash-attention.md.)
template <int STAGES, int AHEAD, bool CTA_SYNC, typename Tiles>
struct TmaRing {
  static_assert(AHEAD >= 1 && AHEAD <= STAGES - 1 && (!CTA_SYNC || AHEAD == STAGES - 1),
                "a slot is refilled once its tile is done");
  Tiles tiles;
  std::uint64_t* bars;  // [STAGES] full, then [STAGES] empty
  int count, tid;

  // Sets up the barriers and loads the first tiles (there is at least one); thread 0 runs
  // with_first(bar), the caller's own loads of extra_bytes, on tile 0's barrier.
  template <typename F>
  __device__ __forceinline__ void start(unsigned extra_bytes, F&& with_first) const {
    if (tid == 0) {
#pragma unroll
      for (int i = 0; i < STAGES; ++i) {
        sm90::mbarrier_init(full(i), 1);
        sm90::mbarrier_init(empty(i), kWgThreads);
      }
      sm90::mbarrier_init_fence();
    }
    __syncthreads();  // the barriers are set up before anyone waits on them
    if (tid == 0) {
      sm90::mbarrier_arrive_expect_tx(full(0), Tiles::kBytes + extra_bytes);
      with_first(full(0));
      tiles.copy(0, full(0));
#pragma unroll
      for (int i = 1; i < AHEAD; ++i) load(i);
    }
  }
  __device__ __forceinline__ void wait(int j) const {
    sm90::mbarrier_wait(full(j), (j / STAGES) & 1);
    if constexpr (CTA_SYNC) __syncthreads();
  }
  __device__ __forceinline__ void advance(int j) const {
    if (tid == 0) load(j + AHEAD);
  }
  // This thread is done with tile j (the wgmmas that read it are waited for).
  __device__ __forceinline__ void release(int j) const {
    if constexpr (!CTA_SYNC) sm90::mbarrier_arrive(empty(j));
  }
  // Tile i into its slot, once that slot's tile is released (by the calling thread too).
  __device__ __forceinline__ void load(int i) const {
    if (i >= count) return;
    if (!CTA_SYNC && i >= STAGES) sm90::mbarrier_wait(empty(i), (i / STAGES - 1) & 1);
    sm90::mbarrier_arrive_expect_tx(full(i), Tiles::kBytes);
    tiles.copy(i, full(i));
  }

 private:
  __device__ __forceinline__ std::uint64_t* full(int i) const { return bars + i % STAGES; }
  __device__ __forceinline__ std::uint64_t* empty(int i) const { return bars + STAGES + i % STAGES; }
};

// The K and V tiles of ROWS keys the Hopper forward and dQ kernels walk (STAGES slots of K, then of
// V): key tile `first` + i of sequence `seq` is tile i. The ring's barriers follow the slots.
template <int D, int ROWS = kWgTileK, int STAGES = kWgStages>
struct KeyValueTiles {
  static constexpr int kTileBytes = ROWS * D * 2, kBytes = 2 * kTileBytes;
  unsigned char* slots;
  const CUtensorMap* k_map;
  const CUtensorMap* v_map;
  int seq, first;

  __device__ __forceinline__ unsigned char* k_tile(int i) const { return slots + (i % STAGES) * kTileBytes; }
  __device__ __forceinline__ unsigned char* v_tile(int i) const { return k_tile(i) + STAGES * kTileBytes; }
  __device__ __forceinline__ std::uint64_t* bars() const {
    return reinterpret_cast<std::uint64_t*>(slots + 2 * STAGES * kTileBytes);
  }
  __device__ __forceinline__ void copy(int i, std::uint64_t* bar) const {
    tma_tile<D, ROWS>(k_tile(i), *k_map, (first + i) * ROWS, seq, bar);
    tma_tile<D, ROWS>(v_tile(i), *v_map, (first + i) * ROWS, seq, bar);
  }
};
template <int D, int ROWS = kWgTileK, int STAGES = kWgStages>
using KeyValueRing = TmaRing<STAGES, STAGES - 2, false, KeyValueTiles<D, ROWS, STAGES>>;
#endif

}  // namespace
}  // namespace lmscope::cuda
