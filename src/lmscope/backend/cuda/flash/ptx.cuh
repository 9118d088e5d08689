// The mma.sync kernels' building blocks (sm_80 and later): cp.async copies into shared memory,
// ldmatrix fragment loads from tiles padded to dodge bank conflicts, m16n8k16 products, the quad
// shuffles; and the element types and constants every flash kernel shares. The mma.sync kernels take
// E = bf16 or half (fp16); the Hopper kernels bf16 only.
// Part of flash_attention.cu's one translation unit: included there only, in order, so that its
// launchers instantiate these templates and the kernels compile as one unit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "lmscope/backend/cuda/storage.cuh"
#include "lmscope/backend/cuda/wgmma.cuh"

namespace lmscope::cuda {
namespace {

using bf16 = __nv_bfloat16;
using half = __half;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

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
// c[16×8] += a[16×16] · b[16×8], E (bf16 or half) in, fp32 accumulate.
template <typename E>
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<E, half>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats rounded to E and packed, lo in the low half: the lower column.
template <typename E>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  if constexpr (std::is_same_v<E, half>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
  }
}
// Two floats stored as a pair of E.
template <typename E>
__device__ __forceinline__ void store_pair(E* at, float lo, float hi) {
  *reinterpret_cast<unsigned*>(at) = pack2<E>(lo, hi);
}

// Fragment geometry of m16n8k16 (lane = 4·g + t): an accumulator holds rows g and g + 8, columns
// 2t and 2t + 1 of its 8-wide block. Two adjacent 8-wide accumulator blocks are exactly the A
// operand of the next product over those 16 columns, which is how P and dS stay in registers.
template <typename E>
__device__ __forceinline__ void accumulators_to_a(unsigned (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack2<E>(lo[0], lo[1]);
  a[1] = pack2<E>(lo[2], lo[3]);
  a[2] = pack2<E>(hi[0], hi[1]);
  a[3] = pack2<E>(hi[2], hi[3]);
}

// Shared tiles are [rows][D + 8]: the 16-byte pad puts the 8 rows one ldmatrix reads in 8 distinct
// bank groups for every supported D.
template <int D>
constexpr int kStride = D + 8;

// A operand (16 rows × 16 k) from a row-major [m][k] tile at (row0, k0).
template <int STRIDE, typename E>
__device__ __forceinline__ void load_a(unsigned (&a)[4], const E* tile, int row0, int k0, int lane) {
  ldmatrix_x4(a, tile + (row0 + (lane % 16)) * STRIDE + k0 + (lane / 16) * 8);
}
// A operand from a tile stored transposed, [k][m].
template <int STRIDE, typename E>
__device__ __forceinline__ void load_a_trans(unsigned (&a)[4], const E* tile, int row0, int k0, int lane) {
  ldmatrix_x4_trans(a, tile + (k0 + (lane % 8) + 8 * (lane / 16)) * STRIDE + row0 + 8 * ((lane / 8) % 2));
}
// B operands of two adjacent 8-wide n blocks (n0..n0+15) × 16 k, from a tile stored [n][k].
template <int STRIDE, typename E>
__device__ __forceinline__ void load_b(unsigned (&b)[4], const E* tile, int n0, int k0, int lane) {
  ldmatrix_x4(b, tile + (n0 + (lane % 8) + 8 * (lane / 16)) * STRIDE + k0 + 8 * ((lane / 8) % 2));
}
// The same from a tile stored [k][n].
template <int STRIDE, typename E>
__device__ __forceinline__ void load_b_trans(unsigned (&b)[4], const E* tile, int n0, int k0, int lane) {
  ldmatrix_x4_trans(b, tile + (k0 + (lane % 8) + 8 * ((lane / 8) % 2)) * STRIDE + n0 + 8 * (lane / 16));
}

// c[N/8 blocks] += a(16 × K, from registers) · b(K × N, in shared memory), with b stored [n][k]
// (N rows of K values: the product is a·bᵀ of the stored tile) or [k][n].
template <int K, int N, int STRIDE, bool B_STORED_NK, typename E>
__device__ __forceinline__ void mma_tile(float (&c)[N / 8][4], const unsigned (&a)[K / 16][4], const E* b, int lane) {
#pragma unroll
  for (int kc = 0; kc < K / 16; ++kc)
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      unsigned f[4];
      if constexpr (B_STORED_NK)
        load_b<STRIDE>(f, b, np * 16, kc * 16, lane);
      else
        load_b_trans<STRIDE>(f, b, np * 16, kc * 16, lane);
      mma<E>(c[2 * np], a[kc], f[0], f[1]);
      mma<E>(c[2 * np + 1], a[kc], f[2], f[3]);
    }
}
template <int K, int N, int STRIDE, typename E>
__device__ __forceinline__ void mma_abt(float (&c)[N / 8][4], const unsigned (&a)[K / 16][4], const E* b, int lane) {
  mma_tile<K, N, STRIDE, true>(c, a, b, lane);
}
template <int K, int N, int STRIDE, typename E>
__device__ __forceinline__ void mma_ab(float (&c)[N / 8][4], const unsigned (&a)[K / 16][4], const E* b, int lane) {
  mma_tile<K, N, STRIDE, false>(c, a, b, lane);
}

// ROWS rows of a [total, D] 16-bit matrix from row r0 into a [ROWS][D + 8] tile; rows past the end
// are zeros.
// The trip count is fixed at compile time so that the loop unrolls (bounded by tid it compiled to a
// generic loop with remainder branches). Beyond 6 passes it unrolls by 4: the d 128 dQ kernel,
// fully unrolled, reached 254 registers and ran 4% slower (docs/log/flash-attention.md, step 15).
template <int D, int ROWS, int THREADS, typename E>
__device__ __forceinline__ void load_tile(E* tile, const E* src, int r0, int total, int tid) {
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

}  // namespace
}  // namespace lmscope::cuda
