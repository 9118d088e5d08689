// FlashAttention-2 (MODEL.md) on the GPU, written here. Three paths:
// - tensor cores (bf16 storage, head dims 16, 32, 64, 80, 96, 128): mma.sync m16n8k16 with fp32
//   accumulation, operands staged in shared memory by cp.async (double-buffered) and read with
//   ldmatrix; each warp owns 16 rows, the softmax statistics live in registers;
// - on Hopper, bf16 at d 32, 64 and 128 with enough tiles to fill the GPU: wgmma (warpgroup MMA
//   reading swizzled shared memory that the copy engine, TMA, fills), the same algorithm in both
//   directions;
// - CUDA cores (fp32 storage, or any head dim up to 128): the same tiling in plain fp32 arithmetic,
//   four threads per row. This is what --precision fp32 means: no tensor cores.
// Backward: delta = rowsum(dO∘O) first; then dK and dV per key tile; dQ either accumulated by the
// dK/dV pass with fp32 atomics (fast, order varies) or by its own pass over key tiles (deterministic).
// docs/flash-attention.md has the floors, the measurements and why the code is shaped so.
#include "lmscope/cuda/launch_check.cuh"
#include "lmscope/cuda/storage.cuh"
#include "lmscope/cuda/tile_order.h"
#include "lmscope/cuda/wgmma.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace lmscope::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---------------------------------------------------------------- PTX helpers (sm_80 and later)
// 16 bytes global -> shared; zero-filled when !valid (the source is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {  // until at most PENDING commit groups are in flight
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// c[16×8] += a[16×16] · b[16×8], bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo in the low half: the lower column
  return *reinterpret_cast<const unsigned*>(&v);
}

// Fragment geometry of m16n8k16 (lane = 4·g + t): an accumulator holds rows g and g + 8, columns
// 2t and 2t + 1 of its 8-wide block. Two adjacent 8-wide accumulator blocks are exactly the A
// operand of the next product over those 16 columns, which is how P and dS stay in registers.
__device__ __forceinline__ void accumulators_to_a(unsigned (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// Shared tiles are [rows][D + 8]: the 16-byte pad puts the 8 rows one ldmatrix reads in 8 distinct
// bank groups for every supported D.
template <int D>
constexpr int kStride = D + 8;

// A operand (16 rows × 16 k) from a row-major [m][k] tile at (row0, k0).
template <int STRIDE>
__device__ __forceinline__ void load_a(unsigned (&a)[4], const bf16* tile, int row0, int k0, int lane) {
  ldmatrix_x4(a, tile + (row0 + (lane % 16)) * STRIDE + k0 + (lane / 16) * 8);
}
// A operand from a tile stored transposed, [k][m].
template <int STRIDE>
__device__ __forceinline__ void load_a_trans(unsigned (&a)[4], const bf16* tile, int row0, int k0, int lane) {
  ldmatrix_x4_trans(a, tile + (k0 + (lane % 8) + 8 * (lane / 16)) * STRIDE + row0 + 8 * ((lane / 8) % 2));
}
// B operands of two adjacent 8-wide n blocks (n0..n0+15) × 16 k, from a tile stored [n][k].
template <int STRIDE>
__device__ __forceinline__ void load_b(unsigned (&b)[4], const bf16* tile, int n0, int k0, int lane) {
  ldmatrix_x4(b, tile + (n0 + (lane % 8) + 8 * (lane / 16)) * STRIDE + k0 + 8 * ((lane / 8) % 2));
}
// The same from a tile stored [k][n].
template <int STRIDE>
__device__ __forceinline__ void load_b_trans(unsigned (&b)[4], const bf16* tile, int n0, int k0, int lane) {
  ldmatrix_x4_trans(b, tile + (k0 + (lane % 8) + 8 * ((lane / 8) % 2)) * STRIDE + n0 + 8 * (lane / 16));
}

// c[N/8 blocks] += a(16 × K, from registers) · b(K × N, in shared memory), with b stored [n][k]
// (N rows of K values: the product is a·bᵀ of the stored tile) or [k][n].
template <int K, int N, int STRIDE, bool B_STORED_NK>
__device__ __forceinline__ void mma_tile(float (&c)[N / 8][4], const unsigned (&a)[K / 16][4], const bf16* b,
                                         int lane) {
#pragma unroll
  for (int kc = 0; kc < K / 16; ++kc)
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      unsigned f[4];
      if constexpr (B_STORED_NK)
        load_b<STRIDE>(f, b, np * 16, kc * 16, lane);
      else
        load_b_trans<STRIDE>(f, b, np * 16, kc * 16, lane);
      mma(c[2 * np], a[kc], f[0], f[1]);
      mma(c[2 * np + 1], a[kc], f[2], f[3]);
    }
}
template <int K, int N, int STRIDE>
__device__ __forceinline__ void mma_abt(float (&c)[N / 8][4], const unsigned (&a)[K / 16][4], const bf16* b, int lane) {
  mma_tile<K, N, STRIDE, true>(c, a, b, lane);
}
template <int K, int N, int STRIDE>
__device__ __forceinline__ void mma_ab(float (&c)[N / 8][4], const unsigned (&a)[K / 16][4], const bf16* b, int lane) {
  mma_tile<K, N, STRIDE, false>(c, a, b, lane);
}

// ROWS rows of a [total, D] bf16 matrix from row r0 into a [ROWS][D + 8] tile; rows past the end
// are zeros.
// The trip count is fixed at compile time so that the loop unrolls (bounded by tid it compiled to a
// generic loop with remainder branches). Beyond 6 passes it unrolls by 4: the d 128 dQ kernel,
// fully unrolled, reached 254 registers and ran 4% slower (docs/flash-attention.md, step 15).
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* src, int r0, int total, int tid) {
  constexpr int kChunks = D / 8, kTotal = ROWS * kChunks, kPasses = (kTotal + THREADS - 1) / THREADS;
#pragma unroll(kPasses > 6 ? 4 : kPasses)
  for (int pass = 0; pass < kPasses; ++pass) {
    const int c = pass * THREADS + tid;
    if (kTotal % THREADS != 0 && c >= kTotal) break;
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = r0 + r < total;
    cp_async16(tile + r * kStride<D> + col, src + static_cast<long long>(valid ? r0 + r : 0) * D + col, valid);
  }
}

template <int N>
__device__ __forceinline__ void zero(float (&c)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.f;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

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
  __device__ __forceinline__ void store2(long long i, float x, float y) const {  // bf16 outputs
    if (parts)
      *reinterpret_cast<float2*>(parts + i) = make_float2(x, y);
    else
      *reinterpret_cast<__nv_bfloat162*>(out + i) = __floats2bfloat162_rn(x, y);
  }
  __device__ __forceinline__ void store(long long i, float x) const {  // fp32 outputs (lse)
    if (parts)
      parts[i] = x;
    else
      out[i] = x;
  }
};

// ---------------------------------------------------------------- tensor-core forward
template <int D, bool SPLIT>
__global__ void __launch_bounds__(kThreads)
    flash_forward_tc(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                     PartOut<bf16> o_out, PartOut<float> lse_out, int tq, int tk, float scale_log2, bool causal,
                     TileOrder order) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + kTileQ * kStride<D>;  // [2][kTileK][stride]
  bf16* sV = sK + 2 * kTileK * kStride<D>;
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
    const bf16* cK = sK + buf * kTileK * kStride<D>;
    const bf16* cV = sV + buf * kTileK * kStride<D>;
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
    for (int kc = 0; kc < kTileK / 16; ++kc) accumulators_to_a(pa[kc], s[2 * kc], s[2 * kc + 1]);
    mma_ab<kTileK, D, kStride<D>>(acc, pa, cV, lane);
  }
  cp_async_wait_all();  // an empty part loaded its first tiles and ran no step

  // The outputs are made here, not at the top: held through the loop, they cost registers there.
  const PartOut<bf16> o = o_out.at<SPLIT>(cta.part, static_cast<long long>(seq) * tq * D);
  const PartOut<float> lse = lse_out.at<SPLIT>(cta.part, static_cast<long long>(seq) * tq);
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

// ---------------------------------------------------------------- Hopper forward (wgmma, sm_90a)
// Two warpgroups of 64 query rows each; keys in tiles of 64 (128 at d 128). The copy engine (TMA)
// puts K and V into swizzled tiles (wgmma.cuh) that wgmma reads straight from shared memory; Q is
// read once into registers as A fragments, and P goes from the S accumulators to the A fragments
// of P·V without leaving registers, as in the mma.sync kernel.
constexpr int kWgThreads = 256, kWgTileQ = 128, kWgTileK = 64, kWgStages = 4;
// Head dims with Hopper kernels (tiles laid out as sm90::TileOf says).
template <int D>
constexpr bool kHopperHeadDim = D == 32 || D == 64 || D == 128;
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
// 2048-4096 (step 35 in docs/flash-attention.md); 3 slots fit beside Q, 240 registers without spills.
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
  for (int kc = 0; kc < 4; ++kc) accumulators_to_a(a[kc], x[2 * kc], x[2 * kc + 1]);
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
// tile j' are waited for. (Until session 11 every thread copied its share of each tile by cp.async,
// then waited, fenced and arrived on `full`: step 30 in docs/flash-attention.md.)
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
    for (int kc = 0; kc < kTileK / 16; ++kc) accumulators_to_a(pa[kc], s[2 * kc], s[2 * kc + 1]);
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

// ---------------------------------------------------------------- tensor-core backward
// dK and dV of one key tile (16 keys per warp) against every query tile that sees it; with
// ATOMIC_DQ also dQ += dS·K for each query tile, into fp32 dq_accum by atomics.
template <int D, bool ATOMIC_DQ, bool SPLIT>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkdv_tc(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                           const bf16* __restrict__ dout, const float* __restrict__ lse,
                           const float* __restrict__ delta, PartOut<bf16> dk_out, PartOut<bf16> dv_out,
                           float* __restrict__ dq_accum, int tq, int tk, float scale, bool causal, TileOrder order) {
  constexpr int kSStride = kTileQ + 8;  // dSᵀ tile [keys][queries]
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + kTileK * kStride<D>;
  bf16* sQ = sV + kTileK * kStride<D>;                            // [2][kTileQ][stride]
  bf16* sdO = sQ + 2 * kTileQ * kStride<D>;                       // [2][kTileQ][stride]
  bf16* sdS = sdO + 2 * kTileQ * kStride<D>;                      // [kTileK][kSStride]
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
    const bf16* cQ = sQ + buf * kTileQ * kStride<D>;
    const bf16* cdO = sdO + buf * kTileQ * kStride<D>;
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
    for (int kc = 0; kc < kTileQ / 16; ++kc) accumulators_to_a(pa[kc], p[2 * kc], p[2 * kc + 1]);
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
    for (int kc = 0; kc < kTileQ / 16; ++kc) accumulators_to_a(pa[kc], p[2 * kc], p[2 * kc + 1]);
    mma_ab<kTileQ, D, kStride<D>>(dk_acc, pa, cQ, lane);

    if constexpr (ATOMIC_DQ) {
      // dQ (this query tile) += dS·K: dSᵀ goes through shared memory to be read transposed.
#pragma unroll
      for (int nb = 0; nb < kTileQ / 8; ++nb)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<unsigned*>(sdS + (warp * 16 + g + 8 * h) * kSStride + nb * 8 + 2 * t) =
              pack_bf16(p[nb][2 * h], p[nb][2 * h + 1]);
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
          mma(dq[2 * np], a[0], f[0], f[1]);
          mma(dq[2 * np + 1], a[0], f[2], f[3]);
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
  const PartOut<bf16> dk = dk_out.at<SPLIT>(cta.part, koff * D), dv = dv_out.at<SPLIT>(cta.part, koff * D);
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
template <int D, bool SPLIT>
__global__ void __launch_bounds__(kThreads, D == 32 ? 4 : 1)  // d 32: 164 registers gave 3 CTAs per SM (step 27)
    flash_backward_dq_tc(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                         const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                         PartOut<bf16> dq_out, int tq, int tk, float scale, bool causal, TileOrder order) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sdO = sQ + kTileQ * kStride<D>;
  bf16* sK = sdO + kTileQ * kStride<D>;  // [2][kTileK][stride]
  bf16* sV = sK + 2 * kTileK * kStride<D>;
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
    const bf16* cK = sK + buf * kTileK * kStride<D>;
    const bf16* cV = sV + buf * kTileK * kStride<D>;
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
    for (int kc = 0; kc < kTileK / 16; ++kc) accumulators_to_a(sa[kc], p[2 * kc], p[2 * kc + 1]);
    mma_ab<kTileK, D, kStride<D>>(acc, sa, cK, lane);
  }
  cp_async_wait_all();  // an empty part loaded its first tiles and ran no step
  const PartOut<bf16> dq = dq_out.at<SPLIT>(cta.part, qoff * D);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row[h] >= tq) continue;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      dq.store2(static_cast<long long>(row[h]) * D + nd * 8 + 2 * t, acc[nd][2 * h] * scale,
                acc[nd][2 * h + 1] * scale);
  }
}

// ---------------------------------------------------------------- Hopper backward (wgmma, sm_90a)
// One CTA per 128 keys: two warpgroups of 64 keys each, over query tiles of 64 rows (Q, dO, L and
// delta in a TmaRing of QueryTiles, handed over by mbarriers). Per query tile each warpgroup issues
// Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (both operands in shared memory), turns Sᵀ into Pᵀ while dPᵀ runs,
// issues dV += Pᵀ·dO, turns dPᵀ into dSᵀ while that runs, and issues dK += dSᵀ·Q (A operands from
// registers, as P in the forward).
// With ATOMIC_DQ both warpgroups also put dSᵀ in shared memory (two buffers), and dQ = dS·K over
// the CTA's 128 keys (wgmma reading dS transposed) goes to a shared fp32 tile (two buffers), which one
// thread hands to the copy engine: its bulk reduction adds the tile to dq_accum in L2 while the
// warpgroups go on, and no thread waits on global memory (step 22 in docs/flash-attention.md: 8-byte
// atomics from every thread at the end of each tile made the backward 8% slower at d 64).
// - d 128 (kDqAlternating, step 46): one warpgroup computes a tile's whole dQ, warpgroup r % 2 for
//   tile r, into the registers that Sᵀ and dPᵀ held, while the other goes straight on to the next
//   tile. So the two run out of step, and one's exponentials run beside the other's products; they
//   meet only where data passes (named barriers: dSᵀ in, dSᵀ buffer free), and the ring's slots are
//   freed by mbarriers, refilled by the dQ warpgroup, the later one. cuDNN's backward (seen under
//   ncu in session 15) gives dQ to one warpgroup too.
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
  constexpr int kDqCols = kDqAlternating ? D : D / 2;
  const int n0 = kDqAlternating ? 0 : wg * kDqCols;
  float dq[kDqCols / 8][4];
  auto issue_dq = [&](int r) {
    const std::uint64_t ds_desc = DsTile::descriptor(sdS + (r & 1) * kDsBytes);
    std::uint64_t kn_desc = Tile::descriptor(sK + (n0 / kCols) * kWbKeys * Tile::kRowBytes + (n0 % kCols) * 2);
    if constexpr (kDqCols == 2 * kCols) kn_desc = sm90::two_panels(kn_desc, kWbKeys * Tile::kRowBytes);
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
// are issued. At d 128 Q and dO sit in registers as A fragments. At d 32 and 64 wgmma reads them from
// shared memory (at d 64 2% slower): with register fragments there, dq comes out wrong although the
// PTX is right, and the cause is not found (docs/flash-attention.md, steps 16 and 20).
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
  constexpr bool kFromShared = D <= 64;  // Q and dO as shared-memory operands, qa and da unused

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

// ---------------------------------------------------------------- CUDA-core path
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

// ---------------------------------------------------------------- parts (tile_order.h)
// out = Σ_p parts[p] over `count` slices of `slice` floats, in bf16: one thread per four elements,
// added in part order, so the sum does not depend on which part's CTA ran first.
__global__ void add_parts(const float* __restrict__ parts, int count, long long slice, bf16* __restrict__ out) {
  const long long i = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i >= slice) return;
  float4 a = *reinterpret_cast<const float4*>(parts + i);
  for (int p = 1; p < count; ++p) {
    const float4 b = *reinterpret_cast<const float4*>(parts + p * slice + i);
    a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
  }
  *reinterpret_cast<__nv_bfloat162*>(out + i) = __floats2bfloat162_rn(a.x, a.y);
  *reinterpret_cast<__nv_bfloat162*>(out + i + 2) = __floats2bfloat162_rn(a.z, a.w);
}

// The forward's O and L from its parts, each normalised over its own keys (O_p, L_p):
// L = log Σ_p e^{L_p}, O = Σ_p e^{L_p − L}·O_p. One warp per row; lane p < count holds L_p.
__global__ void combine_parts(const float* __restrict__ o_parts, const float* __restrict__ lse_parts, int count,
                              long long rows, int d, bf16* __restrict__ o, float* __restrict__ lse) {
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const float own = lane < count ? lse_parts[lane * rows + row] : -INFINITY;
  float mx = own;
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  const float w = mx == -INFINITY ? 0.f : expf(own - mx);  // −∞: a part that saw no key of this row
  float sum = w;
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  float weight[kMaxParts];
#pragma unroll
  for (int p = 0; p < kMaxParts; ++p) weight[p] = __shfl_sync(0xffffffffu, w, p) * inv;
  if (lane == 0) lse[row] = mx + logf(sum);
  for (int c = 2 * lane; c < d; c += 64) {
    float x = 0.f, y = 0.f;
#pragma unroll
    for (int p = 0; p < kMaxParts; ++p)
      if (p < count) {
        const float2 part = *reinterpret_cast<const float2*>(o_parts + (p * rows + row) * d + c);
        x += weight[p] * part.x, y += weight[p] * part.y;
      }
    *reinterpret_cast<__nv_bfloat162*>(o + row * d + c) = __floats2bfloat162_rn(x, y);
  }
}

// ---------------------------------------------------------------- launch
// Raises a kernel's dynamic shared memory limit where a tile needs more than the default 48 KiB.
template <typename Kernel>
void allow_smem(Kernel kernel, int bytes) {
  if (bytes > 48 * 1024)
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
      throw std::runtime_error("flash attention: the GPU refuses the shared memory a tile needs");
}

// Calls f(std::integral_constant<int, D>{}) for the tensor-core head dim D equal to d; false if none is.
template <int... Ds, typename F>
bool with_head_dim_of(int d, F&& f) {
  return ((d == Ds && (f(std::integral_constant<int, Ds>{}), true)) || ...);
}
template <typename F>
bool with_tc_head_dim(int d, F&& f) {
  return with_head_dim_of<16, 32, 64, 80, 96, 128>(d, std::forward<F>(f));
}

bool tensor_core_path(Elem e, int d) {
  return e == Elem::bf16 && with_tc_head_dim(d, [](auto) {});
}

// Dynamic shared memory of each tensor-core kernel.
template <int D>
constexpr int forward_tc_smem() {
  return (kTileQ + 4 * kTileK) * kStride<D> * 2;
}
template <int D>
constexpr int forward_wgmma_smem() {
  return kWgTileQ * D * 2 + key_value_ring_bytes<D, kForwardTileK<D>, kForwardStages<D>>() + sm90::kAtomBytes;
}
template <int D>
constexpr int dkdv_tc_smem() {
  return (2 * kTileK + 4 * kTileQ) * kStride<D> * 2 + kTileK * (kTileQ + 8) * 2 + 4 * kTileQ * 4;
}
template <int D>
constexpr int dq_tc_smem() {
  return (2 * kTileQ + 4 * kTileK) * kStride<D> * 2;
}
template <int D>
constexpr int dq_wgmma_smem() {
  return 2 * kWgTileQ * D * 2 + key_value_ring_bytes<D, kWgTileK, kWgStages>() + sm90::kAtomBytes;
}

int sm_count() {
  static const int sms = [] {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      throw std::runtime_error("flash attention: cannot read the GPU's SM count");
    return count;
  }();
  return sms;
}
// The GPU's SMs where the Hopper kernels (kHopperHeadDim) can run: a Hopper GPU with their
// sm_90a code in this binary (a build for other architectures, or compute_80 PTX compiled at load,
// leaves it empty); 0 elsewhere, or with LMSCOPE_NO_WGMMA=1, which picks the mma.sync kernels for
// comparison and tests.
bool hopper_capable() {
  static const bool hopper = [] {
    int device = 0, major = 0;
    cudaFuncAttributes attr{};
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major == 9 &&
           cudaFuncGetAttributes(&attr, flash_forward_wgmma<64, false>) == cudaSuccess && attr.ptxVersion >= 90;
  }();
  return hopper;
}
int hopper_sms() {
  if (const char* off = std::getenv("LMSCOPE_NO_WGMMA"); off && *off && std::strcmp(off, "0") != 0) return 0;
  return hopper_capable() ? sm_count() : 0;
}

// TMA maps (wgmma.cuh), encoded by the driver's encoder, reached through the runtime so that nothing
// links libcuda. `dims` and `box` innermost first; `strides` in bytes, one fewer than dims.
CUtensorMap encode_map(CUtensorMapDataType type, cuuint32_t rank, const void* base, const cuuint64_t* dims,
                       const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess || fn == nullptr)
      throw std::runtime_error("flash attention: the CUDA driver offers no cuTensorMapEncodeTiled (TMA)");
    return reinterpret_cast<Encode>(fn);
  }();
  const cuuint32_t unit[3] = {1, 1, 1};
  CUtensorMap map;
  if (encode(&map, type, rank, const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
             swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    throw std::runtime_error("flash attention: encoding a TMA map failed");
  return map;
}
// A [n, rows, D] bf16 tensor in boxes of box_rows rows × one panel, stored in shared memory as
// sm90::TileOf<D> lays it out (64 columns with the 128-byte swizzle, or 32 with the 64-byte one);
// rows past a sequence's end read as zeros.
template <int D>
CUtensorMap tile_map(const void* base, long long n, long long rows, int box_rows) {
  using Tile = sm90::TileOf<D>;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(n)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(D) * 2, static_cast<cuuint64_t>(rows * D) * 2};
  const cuuint32_t box[3] = {Tile::kCols, static_cast<cuuint32_t>(box_rows), 1};
  return encode_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, dims, strides, box,
                    Tile::kRowBytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
}
// An [n, rows] fp32 array (rows a multiple of 4, so each sequence's rows start 16-byte aligned, as
// the copy engine needs) read in runs of `box` rows of one sequence.
CUtensorMap row_map(const float* base, long long n, long long rows, int box) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(n)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(rows) * 4};
  const cuuint32_t boxes[2] = {static_cast<cuuint32_t>(box), 1};
  return encode_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, base, dims, strides, boxes, CU_TENSOR_MAP_SWIZZLE_NONE);
}

// CTAs of a kernel that one SM holds at once (asked of the driver once per kernel and shared memory
// size; the CUDA-core kernels' size follows the head dim).
template <typename Kernel>
int resident_ctas(Kernel kernel, int threads, int smem) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> known;
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = known.try_emplace({reinterpret_cast<const void*>(kernel), smem}, 0);
  if (fresh) {
    allow_smem(kernel, smem);
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem) != cudaSuccess)
      throw std::runtime_error("flash attention: cannot read a kernel's occupancy");
    it->second = std::max(blocks, 1);
  }
  return it->second;
}

// The tiles a kernel's CTAs take: n sequences of t rows in tiles of `rows`, each cut into `parts`;
// `streamed` is the bytes that one sequence's CTAs read tile by tile (K and V under query tiles, Q
// and dO under key tiles).
struct Tiling {
  long long n, t;
  int rows;
  long long streamed;
  int parts = 1;
};

// Launches `kernel` (`name` in errors) with one CTA per tile and part, in tile_order.h's order,
// folded when one wave holds every CTA; the order goes last among the kernel's arguments.
template <typename Kernel, typename... Args>
void launch_tiled(const char* name, Kernel kernel, int threads, int smem, const Tiling& tiling, cudaStream_t s,
                  Args... args) {
  const long long tiles = (tiling.t + tiling.rows - 1) / tiling.rows;
  if (tiling.n * tiles * tiling.parts > std::numeric_limits<int>::max())
    throw std::runtime_error("flash attention: more than 2^31 tiles");
  TileOrder order{static_cast<int>(tiling.n), static_cast<int>(tiles),
                  tile_group(tiling.n, tiles * tiling.parts, tiling.streamed), tiling.parts};
  allow_smem(kernel, smem);
  if (order.ctas() <= static_cast<long long>(resident_ctas(kernel, threads, smem)) * sm_count())
    order.fold = sm_count();
  kernel<<<static_cast<unsigned>(order.ctas()), threads, smem, s>>>(args..., order);
  check_launch(name);
}

static_assert(kTileQ == kPlanSyncTile && kTileK == kPlanSyncTile && kWgTileQ == kPlanHopperTile &&
                  kWbKeys == kPlanHopperTile && kWbTileQ == kPlanHopperQueryTile,
              "flash_plan.cpp counts tiles of the kernels' sizes");

// The residency of every tensor-core kernel, asked of the driver (the Hopper ones only where they run).
FlashKernelFacts read_kernel_facts() {
  FlashKernelFacts facts;
  facts.sms = sm_count();
  facts.hopper = hopper_capable();
  for (int d : {16, 32, 64, 80, 96, 128})
    with_tc_head_dim(d, [&](auto dc) {
      constexpr int D = decltype(dc)::value;
      FlashResidency r;
      r.d = D;
      r.forward_tc = resident_ctas(flash_forward_tc<D, false>, kThreads, forward_tc_smem<D>());
      r.dkdv_tc = resident_ctas(flash_backward_dkdv_tc<D, false, false>, kThreads, dkdv_tc_smem<D>());
      r.dkdv_tc_atomic = resident_ctas(flash_backward_dkdv_tc<D, true, false>, kThreads, dkdv_tc_smem<D>());
      r.dq_tc = resident_ctas(flash_backward_dq_tc<D, false>, kThreads, dq_tc_smem<D>());
      if constexpr (kHopperHeadDim<D>)
        if (facts.hopper) {
          r.forward_wgmma = resident_ctas(flash_forward_wgmma<D, false>, kWgThreads, forward_wgmma_smem<D>());
          r.backward_wgmma =
              resident_ctas(flash_backward_wgmma<D, false, false>, kWgThreads, wgmma_backward_smem<D, false>());
          r.backward_wgmma_atomic =
              resident_ctas(flash_backward_wgmma<D, true, false>, kWgThreads, wgmma_backward_smem<D, true>());
          r.dq_wgmma = resident_ctas(flash_backward_dq_wgmma<D, false>, kWgThreads, dq_wgmma_smem<D>());
        }
      facts.residency.push_back(r);
    });
  return facts;
}

void check_head_dim(int d) {
  if (d < 1 || d > kSimtMaxD) throw std::invalid_argument("flash attention supports head dims 1 to 128");
}

// out (bf16) = the sum of `parts` fp32 slices of `slice` elements at `from`.
void add_parts_into(void* out, const float* from, int parts, long long slice, cudaStream_t s) {
  add_parts<<<static_cast<unsigned>((slice / 4 + 255) / 256), 256, 0, s>>>(from, parts, slice, static_cast<bf16*>(out));
  check_launch("add_parts");
}

}  // namespace

bool flash_attention_supports(int d) { return d >= 1 && d <= kSimtMaxD; }

const FlashKernelFacts& flash_kernel_facts() {
  static const FlashKernelFacts device = read_kernel_facts();
  static const FlashKernelFacts without_wgmma = [] {
    FlashKernelFacts f = device;
    f.hopper = false;
    return f;
  }();
  return hopper_sms() > 0 ? device : without_wgmma;
}

void flash_attention_forward(const void* q, const void* k, const void* v, void* o, float* lse, Elem e, std::int64_t n,
                             std::int64_t tq, std::int64_t tk, int d, float scale, bool causal,
                             const FlashAttentionPlan& plan, float* workspace, cudaStream_t s) {
  check_head_dim(d);
  const float scale_log2 = scale * kLog2e;
  const long long kv_bytes = 2 * tk * d * 2;  // K and V in bf16, streamed under the tensor-core kernels' query tiles
  if (tensor_core_path(e, d)) {
    const int parts = plan.forward_parts;
    const long long q_elems = n * tq * d;
    const PartOut<bf16> o_out{static_cast<bf16*>(o), parts > 1 ? workspace : nullptr, q_elems};
    const PartOut<float> lse_out{lse, parts > 1 ? workspace + parts * q_elems : nullptr, n * tq};
    auto qb = static_cast<const bf16*>(q), kb = static_cast<const bf16*>(k), vb = static_cast<const bf16*>(v);
    with_tc_head_dim(d, [&](auto dc) {
      constexpr int D = decltype(dc)::value;
      if constexpr (kHopperHeadDim<D>)
        if (plan.forward_wgmma) {
          return launch_tiled("flash_forward_wgmma",
                              parts > 1 ? flash_forward_wgmma<D, true> : flash_forward_wgmma<D, false>, kWgThreads,
                              forward_wgmma_smem<D>(), Tiling{n, tq, kWgTileQ, kv_bytes, parts}, s,
                              tile_map<D>(q, n, tq, kWgTileQ), tile_map<D>(k, n, tk, kForwardTileK<D>),
                              tile_map<D>(v, n, tk, kForwardTileK<D>), o_out, lse_out, static_cast<int>(tq),
                              static_cast<int>(tk), scale_log2, causal);
        }
      launch_tiled("flash_forward_tc", parts > 1 ? flash_forward_tc<D, true> : flash_forward_tc<D, false>, kThreads,
                   forward_tc_smem<D>(), Tiling{n, tq, kTileQ, kv_bytes, parts}, s, qb, kb, vb, o_out, lse_out,
                   static_cast<int>(tq), static_cast<int>(tk), scale_log2, causal);
    });
    if (parts > 1) {
      const long long rows = n * tq;
      combine_parts<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(workspace, workspace + parts * q_elems, parts,
                                                                          rows, d, static_cast<bf16*>(o), lse);
      check_launch("combine_parts");
    }
    return;
  }
  with_elem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int smem = (3 * kSimtRows * (d + 1) + kSimtRows * (kSimtRows + 1)) * 4;
    launch_tiled("flash_forward_simt", flash_forward_simt<T>, kSimtThreads, smem,
                 Tiling{n, tq, kSimtRows, 2 * tk * d * static_cast<long long>(sizeof(T))}, s, static_cast<const T*>(q),
                 static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o), lse, static_cast<int>(tq),
                 static_cast<int>(tk), d, scale_log2, causal);
  });
}

void flash_attention_backward(const void* q, const void* k, const void* v, const void* o, const float* lse,
                              const void* dout, void* dq, void* dk, void* dv, Elem e, std::int64_t n, std::int64_t tq,
                              std::int64_t tk, int d, float scale, bool causal, const FlashAttentionPlan& plan,
                              float* delta, float* row_stats, float* dq_accum, float* workspace, cudaStream_t s) {
  check_head_dim(d);
  const long long padded = plan.row_stats_rows > 0 ? plan.row_stats_rows : tq;
  with_elem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    flash_delta<T><<<static_cast<unsigned>((n * padded + 7) / 8), 256, 0, s>>>(
        static_cast<const T*>(o), static_cast<const T*>(dout), lse, delta,
        plan.row_stats_rows > 0 ? row_stats : nullptr, n, tq, padded, d);
  });
  check_launch("flash_delta");
  const int itq = static_cast<int>(tq), itk = static_cast<int>(tk);
  if (tensor_core_path(e, d)) {
    const long long kv_bytes = 2 * tk * d * 2, qdo_bytes = 2 * tq * d * 2;  // bf16 K and V, Q and dO
    const bool atomics = plan.atomic_dq();
    if (atomics && cudaMemsetAsync(dq_accum, 0, sizeof(float) * n * plan.dq_accum_rows * d, s) != cudaSuccess)
      throw std::runtime_error("flash attention: clearing the dq accumulator failed");
    const int kv_parts = plan.dkdv_parts, q_parts = plan.dq_parts;
    const long long q_elems = n * tq * d, k_elems = n * tk * d;
    const PartOut<bf16> dk_out{static_cast<bf16*>(dk), kv_parts > 1 ? workspace : nullptr, k_elems},
        dv_out{static_cast<bf16*>(dv), kv_parts > 1 ? workspace + kv_parts * k_elems : nullptr, k_elems},
        dq_out{static_cast<bf16*>(dq), q_parts > 1 ? workspace : nullptr, q_elems};
    auto qb = static_cast<const bf16*>(q), kb = static_cast<const bf16*>(k), vb = static_cast<const bf16*>(v),
         gb = static_cast<const bf16*>(dout);
    with_tc_head_dim(d, [&](auto dc) {
      constexpr int D = decltype(dc)::value;
      bool dkdv_done = false;
      if constexpr (kHopperHeadDim<D>)
        if (plan.dkdv_wgmma) {
          const CUtensorMap delta_rows = row_map(row_stats, n, plan.row_stats_rows, kWbTileQ),
                            lse_rows = row_map(row_stats + n * plan.row_stats_rows, n, plan.row_stats_rows, kWbTileQ);
          auto launch = [&](auto dkdv, int smem) {
            launch_tiled("flash_backward_wgmma", dkdv, kWgThreads, smem, Tiling{n, tk, kWbKeys, qdo_bytes, kv_parts}, s,
                         tile_map<D>(q, n, tq, kWbTileQ), tile_map<D>(k, n, tk, kWbKeys),
                         tile_map<D>(v, n, tk, kWbKeys), tile_map<D>(dout, n, tq, kWbTileQ), lse_rows, delta_rows,
                         dk_out, dv_out, dq_accum, itq, itk, scale, causal);
          };
          const bool split = kv_parts > 1;
          if (atomics)
            launch(split ? flash_backward_wgmma<D, true, true> : flash_backward_wgmma<D, true, false>,
                   wgmma_backward_smem<D, true>());
          else
            launch(split ? flash_backward_wgmma<D, false, true> : flash_backward_wgmma<D, false, false>,
                   wgmma_backward_smem<D, false>());
          if (atomics) {
            const int tiles = static_cast<int>(plan.dq_accum_rows / kWbTileQ);
            const long long quads = n * plan.dq_accum_rows * D / 4;
            dq_from_tiles<D><<<static_cast<unsigned>((quads + 255) / 256), 256, 0, s>>>(
                dq_accum, static_cast<bf16*>(dq), itq, tiles, quads, scale);
            check_launch("dq_from_tiles");
          }
          dkdv_done = true;
        }
      if (!dkdv_done) {
        auto dkdv =
            atomics ? (kv_parts > 1 ? flash_backward_dkdv_tc<D, true, true> : flash_backward_dkdv_tc<D, true, false>)
                    : (kv_parts > 1 ? flash_backward_dkdv_tc<D, false, true> : flash_backward_dkdv_tc<D, false, false>);
        launch_tiled("flash_backward_dkdv_tc", dkdv, kThreads, dkdv_tc_smem<D>(),
                     Tiling{n, tk, kTileK, qdo_bytes, kv_parts}, s, qb, kb, vb, gb, lse, delta, dk_out, dv_out,
                     dq_accum, itq, itk, scale, causal);
      }
      if (kv_parts > 1) {
        add_parts_into(dk, dk_out.parts, kv_parts, k_elems, s);
        add_parts_into(dv, dv_out.parts, kv_parts, k_elems, s);
      }
      if (atomics) return;
      if constexpr (kHopperHeadDim<D>)
        if (plan.dq_wgmma) {
          launch_tiled("flash_backward_dq_wgmma",
                       q_parts > 1 ? flash_backward_dq_wgmma<D, true> : flash_backward_dq_wgmma<D, false>, kWgThreads,
                       dq_wgmma_smem<D>(), Tiling{n, tq, kWgTileQ, kv_bytes, q_parts}, s,
                       tile_map<D>(q, n, tq, kWgTileQ), tile_map<D>(k, n, tk, kWgTileK),
                       tile_map<D>(v, n, tk, kWgTileK), tile_map<D>(dout, n, tq, kWgTileQ), lse, delta, dq_out, itq,
                       itk, scale, causal);
          if (q_parts > 1) add_parts_into(dq, workspace, q_parts, q_elems, s);
          return;
        }
      launch_tiled("flash_backward_dq_tc", q_parts > 1 ? flash_backward_dq_tc<D, true> : flash_backward_dq_tc<D, false>,
                   kThreads, dq_tc_smem<D>(), Tiling{n, tq, kTileQ, kv_bytes, q_parts}, s, qb, kb, vb, gb, lse, delta,
                   dq_out, itq, itk, scale, causal);
      if (q_parts > 1) add_parts_into(dq, workspace, q_parts, q_elems, s);
    });
    if (atomics && !plan.dkdv_wgmma) cast(dq_accum, Elem::f32, dq, Elem::bf16, n * tq * d, s);
    return;
  }
  with_elem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto qt = static_cast<const T*>(q), kt = static_cast<const T*>(k), vt = static_cast<const T*>(v),
         gt = static_cast<const T*>(dout);
    const int smem_kv = (4 * kSimtRows * (d + 1) + 2 * kSimtRows * (kSimtRows + 1) + 2 * kSimtRows) * 4;
    const long long row_bytes = d * static_cast<long long>(sizeof(T));
    launch_tiled("flash_backward_dkdv_simt", flash_backward_dkdv_simt<T>, kSimtThreads, smem_kv,
                 Tiling{n, tk, kSimtRows, 2 * tq * row_bytes}, s, qt, kt, vt, gt, lse, delta, static_cast<T*>(dk),
                 static_cast<T*>(dv), itq, itk, d, scale, causal);
    const int smem_q = (4 * kSimtRows * (d + 1) + kSimtRows * (kSimtRows + 1)) * 4;
    launch_tiled("flash_backward_dq_simt", flash_backward_dq_simt<T>, kSimtThreads, smem_q,
                 Tiling{n, tq, kSimtRows, 2 * tk * row_bytes}, s, qt, kt, vt, gt, lse, delta, static_cast<T*>(dq), itq,
                 itk, d, scale, causal);
  });
}

}  // namespace lmscope::cuda
