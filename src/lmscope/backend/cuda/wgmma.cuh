// Hopper (sm_90a) warpgroup MMA: the pieces the flash-attention kernels build on, written here from
// the PTX ISA (§9.7.15, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate").
//
// Shared tiles are swizzled (Swizzled below): a tile of R rows × C bf16 columns is stored as panels
// of R rows × ROW_BYTES bytes (128: 64 columns, d 64 and 128; 64: 32 columns, d 32; 32: 16 columns,
// d 80), and the 16-byte chunk c of row r sits at chunk c ^ (r · ROW_BYTES / 128 mod ROW_BYTES / 16)
// of that row. The same bytes serve both majors: read as a K-major operand, rows are M or N and the
// panel's columns are K; read as an MN-major operand (transposed), rows are K and the columns N.
// Eight rows are one swizzle atom, so panels must start atom-aligned (1024 bytes at most).
//
// Only compiled into sm_90a code (LMSCOPE_WGMMA); the host checks the device before launching.
#pragma once

#include <cuda.h>  // CUtensorMap only: the maps are encoded through the runtime's driver entry point
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LMSCOPE_WGMMA 1
#endif

namespace lmscope::cuda {
// The shared-memory address of p, as PTX's .shared operands take it (sm_80 kernels use it too).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
}  // namespace lmscope::cuda

namespace lmscope::cuda::sm90 {

constexpr int kAtomBytes = 1024;  // the largest swizzle atom: 8 rows of 128 bytes

// The layout of a swizzled tile with ROW_BYTES-byte rows (128, 64 or 32).
template <int ROW_BYTES>
struct Swizzled {
  static_assert(ROW_BYTES == 128 || ROW_BYTES == 64 || ROW_BYTES == 32, "the swizzles these kernels use");
  static constexpr int kRowBytes = ROW_BYTES, kCols = ROW_BYTES / 2, kChunks = ROW_BYTES / 16;

  // Byte offset of the 16-byte chunk `chunk` (8 columns) of row r in a tile of `rows` rows.
  __device__ __forceinline__ static int offset(int r, int chunk, int rows) {
    return (chunk / kChunks) * rows * ROW_BYTES + r * ROW_BYTES +
           (((chunk % kChunks) ^ ((r * ROW_BYTES / 128) % kChunks)) << 4);
  }
  // Byte offset of the kc-th 16-column step of K in a tile of `rows` rows read as a K-major operand:
  // 32 bytes per step within a panel (the hardware applies the swizzle), panels `rows` rows apart.
  __device__ __forceinline__ static int k_step(int kc, int rows) {
    constexpr int kSteps = ROW_BYTES / 32;
    return (kc / kSteps) * rows * ROW_BYTES + (kc % kSteps) * 32;
  }
  // Matrix descriptor of the operand starting at p: this swizzle (mode 1: 128 bytes, 2: 64, 3: 32), 8-row
  // groups 8 rows apart (the stride byte offset). The leading byte offset is not used by swizzled
  // K-major operands, nor by MN-major ones no wider than a panel; mma_rs_panels sets it for one
  // that spans several (panels_as_one).
  __device__ __forceinline__ static std::uint64_t descriptor(const void* p) {
    const std::uint64_t addr = smem_addr(p);
    constexpr std::uint64_t kGroup = 8 * ROW_BYTES, kMode = ROW_BYTES == 128 ? 1 : ROW_BYTES == 64 ? 2 : 3;
    return ((addr & 0x3FFFF) >> 4) | ((kGroup >> 4) << 16) | ((kGroup >> 4) << 32) | (kMode << 62);
  }
};
// The layout of a bf16 tile of D columns: 64-column panels with the 128-byte swizzle, for D 32 one
// 32-column panel with the 64-byte swizzle, for D 80 five 16-column panels with the 32-byte swizzle
// (the copy engine's box and wgmma's operand both take it).
template <int D>
using TileOf = Swizzled<(D % 64 == 0 ? 64
                         : D == 32   ? 32
                                     : 16) *
                        2>;
template <int D>
constexpr int kPanels = D / TileOf<D>::kCols;

// The descriptor of the operand `bytes` (a multiple of 16) further on: the start address field is
// in 16-byte units, and shared addresses stay below its 2^18-byte range.
__device__ __forceinline__ std::uint64_t advance(std::uint64_t desc, int bytes) {
  return desc + static_cast<std::uint64_t>(bytes >> 4);
}

#ifdef LMSCOPE_WGMMA
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written by ordinary stores or cp.async, made visible to wgmma's (async proxy) reads.
__device__ __forceinline__ void fence_shared_for_async_reads() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// mbarriers (PTX ISA §9.7.13.15): a 64-bit shared word that completes a phase once `count` arrivals
// have come; a waiter names the phase by its parity (phase k completes with parity k % 2).
__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// The tensor memory accelerator (TMA, PTX ISA §9.7.9.25.5, cp.async.bulk.tensor): one thread asks
// the copy engine for a whole box of a tensor described by a CUtensorMap (a __grid_constant__
// kernel parameter, passed here by address); the engine writes it to shared memory in the map's
// swizzle, fills rows past the tensor's end with zeros, and counts the bytes on an mbarrier, whose
// phase completes once the arrivals and the announced bytes (expect_tx) are all in. Its writes are
// made by the async proxy, so wgmma reads them after the barrier without a proxy fence.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival on bar that also announces `bytes` still to land in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// The box at coordinates (c0, c1, c2), innermost first, of the map's 3-d tensor into dst (1024-byte
// aligned for the 128-byte swizzle), its bytes counted on bar.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap& map, int c0, int c1, int c2,
                                            std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<std::uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}
// The box at coordinates (c0, c1) of the map's 2-d tensor into dst (128-byte aligned), counted on bar.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap& map, int c0, int c1, std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<std::uint64_t>(&map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}
// One 16-byte shared store. Written out because the compiler splits a float4 store of wgmma
// accumulators into four 4-byte stores, which at 16 bytes per lane also conflict 4 ways (step 24
// in docs/log/flash-attention.md: the backward's dQ staging cost 0.4 ms at d 64 that way).
__device__ __forceinline__ void store_shared_v4(float* p, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(p)), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}
// Bulk reduction (PTX ISA §9.7.9.25.4.2, cp.reduce.async.bulk): the copy engine adds `bytes` (a
// multiple of 16, both addresses 16-byte aligned) of fp32 from shared memory into global memory,
// in L2, while the issuing thread goes on. Shared memory written by ordinary stores must be fenced
// for the async proxy (fence_shared_for_async_reads) by its writers before the issuing thread sees
// it. One commit group per call; bulk_wait_read<N> returns once all but the newest N groups have
// read their source (it may be rewritten), bulk_wait<N> once their writes are done as well.
__device__ __forceinline__ void bulk_reduce_add(float* dst, const void* src, int bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(dst),
      "r"(smem_addr(src)), "r"(bytes)
      : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// Named barriers 1-15 (bar.sync / bar.arrive): `count` threads, whole warps, meet at barrier `id`;
// arrive() counts this thread's warp in without waiting. Barrier 0 is __syncthreads'.
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// Pins registers a wgmma writes (accumulators, float) or reads (A fragments, unsigned). Called after
// the wait that covers the wgmma, it keeps the compiler from moving their uses before the wait or
// reusing their registers while the tensor cores may still read them.
template <typename T, int NB>
__device__ __forceinline__ void hold(T (&x)[NB][4]) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, unsigned>);
#pragma unroll
  for (int i = 0; i < NB; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (std::is_same_v<T, float>)
        asm volatile("" : "+f"(x[i][e])::"memory");
      else
        asm volatile("" : "+r"(x[i][e])::"memory");
    }
}

#define LMSCOPE_WGMMA_D8 \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
#define LMSCOPE_WGMMA_D16                                                                                     \
  LMSCOPE_WGMMA_D8, "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), \
      "+f"(d[3][2]), "+f"(d[3][3])
#define LMSCOPE_WGMMA_D32                                                                                      \
  LMSCOPE_WGMMA_D16, "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), \
      "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), \
      "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define LMSCOPE_WGMMA_D40                                                                                      \
  LMSCOPE_WGMMA_D32, "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), \
      "+f"(d[9][2]), "+f"(d[9][3])
#define LMSCOPE_WGMMA_D64                                                                                             \
  LMSCOPE_WGMMA_D32, "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]),        \
      "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]),   \
      "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), \
      "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), \
      "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define LMSCOPE_WGMMA_REGS8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define LMSCOPE_WGMMA_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define LMSCOPE_WGMMA_REGS32                                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define LMSCOPE_WGMMA_REGS40                                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}"
#define LMSCOPE_WGMMA_REGS64                                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "  \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d[64 × N] (+)= a[64 × 16] · b[16 × N], N 32, 64, 80 or 128: a from registers (the m16n8k16 A
// fragment of each warp's 16 rows), b from shared memory, K-major (TRANS_B false: stored [n][k]) or
// N-major (stored [k][n]). The accumulator layout is m16n8k16's, N/8 8-column blocks side by side per
// warp.
template <bool TRANS_B, int N = 64>
__device__ __forceinline__ void mma_rs(float (&d)[N / 8][4], const unsigned (&a)[4], std::uint64_t b, bool accumulate) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 80 || N == 128,
                "wgmma shapes these kernels issue from registers");
  if constexpr (N == 128)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " LMSCOPE_WGMMA_REGS64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : LMSCOPE_WGMMA_D64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)), "n"(TRANS_B ? 1 : 0));
  else if constexpr (N == 64)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LMSCOPE_WGMMA_REGS32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : LMSCOPE_WGMMA_D32
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)), "n"(TRANS_B ? 1 : 0));
  else if constexpr (N == 80)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 " LMSCOPE_WGMMA_REGS40
        ", {%40, %41, %42, %43}, %44, p, 1, 1, %46;\n}\n"
        : LMSCOPE_WGMMA_D40
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)), "n"(TRANS_B ? 1 : 0));
  else if constexpr (N == 32)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " LMSCOPE_WGMMA_REGS16
        ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
        : LMSCOPE_WGMMA_D16
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)), "n"(TRANS_B ? 1 : 0));
}

// The descriptor of an N-major operand stored as several panels (two of 64 columns, 128 wide; five
// of 16, 80 wide), panel 0 at desc's address and each next one panel_bytes further: the panels'
// distance is its leading byte offset.
__device__ __forceinline__ std::uint64_t panels_as_one(std::uint64_t desc, int panel_bytes) {
  constexpr std::uint64_t kLeading = 0x3FFFull << 16;
  return (desc & ~kLeading) | (static_cast<std::uint64_t>(panel_bytes >> 4) << 16);
}

// acc[p] += a[64 × 16] · panel p of an N-major b (TileOf's N-column panels, panel 0 at b, each next
// one panel_bytes further): one product per panel, or for two 64-column panels one n128 product
// (panels_as_one; half the instructions, each A fragment read once: step 42 in docs/log/flash-attention.md),
// and for five 16-column panels one n80 product.
template <int PANELS, int N>
__device__ __forceinline__ void mma_rs_panels(float (&acc)[PANELS][N / 8][4], const unsigned (&a)[4], std::uint64_t b,
                                              int panel_bytes) {
  if constexpr (PANELS == 2 && N == 64) {
    mma_rs<true, 128>(*reinterpret_cast<float(*)[16][4]>(&acc[0][0][0]), a, panels_as_one(b, panel_bytes), true);
  } else if constexpr (PANELS == 5 && N == 16) {
    mma_rs<true, 80>(*reinterpret_cast<float(*)[10][4]>(&acc[0][0][0]), a, panels_as_one(b, panel_bytes), true);
  } else {
#pragma unroll
    for (int p = 0; p < PANELS; ++p) mma_rs<true, N>(acc[p], a, advance(b, p * panel_bytes), true);
  }
}

// d[64 × N] (+)= a[64 × 16] · b[16 × N], N 16, 32, 64 or 128, both operands in shared memory: a
// K-major (TRANS_A false: stored [m][k]) or M-major (stored [k][m]), b as above.
template <int N, bool TRANS_A, bool TRANS_B>
__device__ __forceinline__ void mma_ss(float (&d)[N / 8][4], std::uint64_t a, std::uint64_t b, bool accumulate) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "wgmma shapes these kernels issue: n16 to n128");
  if constexpr (N == 128)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " LMSCOPE_WGMMA_REGS64
        ", %64, %65, p, 1, 1, %67, %68;\n}\n"
        : LMSCOPE_WGMMA_D64
        : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(TRANS_A ? 1 : 0), "n"(TRANS_B ? 1 : 0));
  else if constexpr (N == 64)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LMSCOPE_WGMMA_REGS32
        ", %32, %33, p, 1, 1, %35, %36;\n}\n"
        : LMSCOPE_WGMMA_D32
        : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(TRANS_A ? 1 : 0), "n"(TRANS_B ? 1 : 0));
  else if constexpr (N == 32)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " LMSCOPE_WGMMA_REGS16
        ", %16, %17, p, 1, 1, %19, %20;\n}\n"
        : LMSCOPE_WGMMA_D16
        : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(TRANS_A ? 1 : 0), "n"(TRANS_B ? 1 : 0));
  else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " LMSCOPE_WGMMA_REGS8 ", %8, %9, p, 1, 1, %11, %12;\n}\n"
        : LMSCOPE_WGMMA_D8
        : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(TRANS_A ? 1 : 0), "n"(TRANS_B ? 1 : 0));
}
#undef LMSCOPE_WGMMA_D8
#undef LMSCOPE_WGMMA_REGS8
#undef LMSCOPE_WGMMA_D16
#undef LMSCOPE_WGMMA_REGS16
#undef LMSCOPE_WGMMA_D32
#undef LMSCOPE_WGMMA_REGS32
#undef LMSCOPE_WGMMA_D40
#undef LMSCOPE_WGMMA_REGS40
#undef LMSCOPE_WGMMA_D64
#undef LMSCOPE_WGMMA_REGS64
#endif

}  // namespace lmscope::cuda::sm90
