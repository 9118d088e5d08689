// FlashAttention-2 (MODEL.md) on the GPU, written here: the launchers, and the dispatch that picks a
// kernel and how many parts to cut tiles into. Three paths, each in its family's headers (flash/):
// - tensor cores (bf16 or fp16 storage, head dims 16, 32, 64, 80, 96, 128): mma.sync m16n8k16, fp32
//   accumulation, operands staged in shared memory by cp.async (double-buffered) and read with
//   ldmatrix; each warp owns 16 rows, the softmax statistics live in registers (ptx.cuh,
//   online_softmax.cuh, sm80_forward.cuh, sm80_backward.cuh);
// - on Hopper, bf16 at d 32, 64, 80 and 128 with enough tiles to fill the GPU: wgmma (warpgroup MMA
//   reading swizzled shared memory that the copy engine, TMA, fills), the same algorithm in both
//   directions (sm90_tiles.cuh, sm90_forward.cuh, sm90_backward.cuh);
// - CUDA cores (fp32 storage, or any head dim up to 128): the same tiling in plain fp32 arithmetic,
//   four threads per row (cuda_core.cuh). This is what --precision fp32 means: no tensor cores.
// Backward: delta = rowsum(dO∘O) first; then dK and dV per key tile; dQ either accumulated by the
// dK/dV pass with fp32 atomics (on Hopper, bulk reductions of whole tiles; fast, order varies) or by
// its own pass over key tiles (deterministic).
// Tiles cut into parts add or combine their parts in order (parts.cuh).
// The headers are one translation unit with this file, included in the order below.
// docs/flash-attention.md has the floors, the measurements and why the code is shaped so; the steps
// comments cite (step N) are entries of docs/log/flash-attention.md, each with its date and commit.
#include "lmscope/backend/cuda/launch_check.cuh"
#include "lmscope/backend/cuda/per_device.cuh"
#include "lmscope/backend/cuda/storage.cuh"
#include "lmscope/backend/cuda/wgmma.cuh"
#include "lmscope/device/tile_order.h"

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

// In the order the kernels are compiled in, not sorted.
// clang-format off
#include "lmscope/backend/cuda/flash/ptx.cuh"
#include "lmscope/backend/cuda/flash/online_softmax.cuh"
#include "lmscope/backend/cuda/flash/sm80_forward.cuh"
#include "lmscope/backend/cuda/flash/sm90_tiles.cuh"
#include "lmscope/backend/cuda/flash/sm90_forward.cuh"
#include "lmscope/backend/cuda/flash/sm80_backward.cuh"
#include "lmscope/backend/cuda/flash/sm90_backward.cuh"
#include "lmscope/backend/cuda/flash/cuda_core.cuh"
#include "lmscope/backend/cuda/flash/parts.cuh"
// clang-format on

namespace lmscope::cuda {
namespace {

// Raises a kernel's dynamic shared memory limit where a tile needs more than the default 48 KiB: once
// per kernel, device and size, since the setting stays and costs microseconds of host time a launch
// (attention called from PyTorch at seq 4096 waits on the host, not the GPU).
template <typename Kernel>
void allow_smem(Kernel kernel, int bytes) {
  if (bytes <= 48 * 1024) return;
  static PerDevice<std::pair<const void*, int>, bool> raised;
  raised.get({reinterpret_cast<const void*>(kernel), bytes}, [&](int) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
      throw std::runtime_error("flash attention: the GPU refuses the shared memory a tile needs");
    return true;
  });
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
  return (e == Elem::bf16 || e == Elem::f16) && with_tc_head_dim(d, [](auto) {});
}
// Calls f(Tag<E>{}) with E the 16-bit type the tensor-core kernels take for e (bf16 or half).
template <typename F>
void with_tensor_core_elem(Elem e, F&& f) {
  if (e == Elem::f16)
    f(Tag<half>{});
  else
    f(Tag<bf16>{});
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

// The current GPU's SMs (per device: per_device.cuh).
int sm_count() {
  static PerDevice<int, int> known;
  return known.get(0, [](int device) {
    int count = 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      throw std::runtime_error("flash attention: cannot read the GPU's SM count");
    return count;
  });
}
// The current GPU's SMs where the Hopper kernels (kHopperHeadDim) can run: a Hopper GPU with their
// sm_90a code in this binary (a build for other architectures, or compute_80 PTX compiled at load,
// leaves it empty); 0 elsewhere, or with LMSCOPE_NO_WGMMA=1, which picks the mma.sync kernels for
// comparison and tests.
bool hopper_capable() {
  static PerDevice<int, bool> known;
  return known.get(0, [](int device) {
    int major = 0;
    cudaFuncAttributes attr{};
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major == 9 &&
           cudaFuncGetAttributes(&attr, flash_forward_wgmma<64, false>) == cudaSuccess && attr.ptxVersion >= 90;
  });
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
  // The driver's function, the same for every device: one per process is safe.
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
// sm90::TileOf<D> lays it out (64 columns with the 128-byte swizzle, 32 with the 64-byte one, or 16
// with the 32-byte one);
// rows past a sequence's end read as zeros.
template <int D>
CUtensorMap tile_map(const void* base, long long n, long long rows, int box_rows) {
  using Tile = sm90::TileOf<D>;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(n)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(D) * 2, static_cast<cuuint64_t>(rows * D) * 2};
  const cuuint32_t box[3] = {Tile::kCols, static_cast<cuuint32_t>(box_rows), 1};
  return encode_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, dims, strides, box,
                    Tile::kRowBytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                    : Tile::kRowBytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                            : CU_TENSOR_MAP_SWIZZLE_32B);
}
// An [n, rows] fp32 array (rows a multiple of 4, so each sequence's rows start 16-byte aligned, as
// the copy engine needs) read in runs of `box` rows of one sequence.
CUtensorMap row_map(const float* base, long long n, long long rows, int box) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(n)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(rows) * 4};
  const cuuint32_t boxes[2] = {static_cast<cuuint32_t>(box), 1};
  return encode_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, base, dims, strides, boxes, CU_TENSOR_MAP_SWIZZLE_NONE);
}

// CTAs of a kernel that one SM of the current GPU holds at once (asked of the driver once per device,
// kernel and shared memory size; the CUDA-core kernels' size follows the head dim).
template <typename Kernel>
int resident_ctas(Kernel kernel, int threads, int smem) {
  static PerDevice<std::pair<const void*, int>, int> known;
  return known.get({reinterpret_cast<const void*>(kernel), smem}, [&](int) {
    allow_smem(kernel, smem);
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem) != cudaSuccess)
      throw std::runtime_error("flash attention: cannot read a kernel's occupancy");
    return std::max(blocks, 1);
  });
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
      // The fp16 kernels are the bf16 ones with another mma and conversions; the plan counts with the
      // fewer CTAs of the two, should their registers differ.
      auto both = [](auto bf16_kernel, auto half_kernel, int smem) {
        return std::min(resident_ctas(bf16_kernel, kThreads, smem), resident_ctas(half_kernel, kThreads, smem));
      };
      r.forward_tc = both(flash_forward_tc<bf16, D, false>, flash_forward_tc<half, D, false>, forward_tc_smem<D>());
      r.dkdv_tc = both(flash_backward_dkdv_tc<bf16, D, false, false>, flash_backward_dkdv_tc<half, D, false, false>,
                       dkdv_tc_smem<D>());
      r.dkdv_tc_atomic = both(flash_backward_dkdv_tc<bf16, D, true, false>,
                              flash_backward_dkdv_tc<half, D, true, false>, dkdv_tc_smem<D>());
      r.dq_tc = both(flash_backward_dq_tc<bf16, D, false>, flash_backward_dq_tc<half, D, false>, dq_tc_smem<D>());
      if constexpr (kHopperHeadDim<D>)
        if (facts.hopper) {
          r.forward_wgmma = resident_ctas(flash_forward_wgmma<D, false>, kWgThreads, forward_wgmma_smem<D>());
          r.backward_wgmma =
              resident_ctas(flash_backward_wgmma<D, false, false>, kWgThreads, wgmma_backward_smem<D, false>());
          if constexpr (kHopperAtomicHeadDim<D>)
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

// out (E) = the sum of `parts` fp32 slices of `slice` elements at `from`.
template <typename E>
void add_parts_into(void* out, const float* from, int parts, long long slice, cudaStream_t s) {
  add_parts<<<static_cast<unsigned>((slice / 4 + 255) / 256), 256, 0, s>>>(from, parts, slice, static_cast<E*>(out));
  check_launch("add_parts");
}

}  // namespace

bool flash_attention_supports(int d) { return d >= 1 && d <= kSimtMaxD; }

FlashKernelFacts flash_kernel_facts() {
  static PerDevice<int, FlashKernelFacts> known;
  FlashKernelFacts facts = known.get(0, [](int) { return read_kernel_facts(); });
  if (hopper_sms() == 0) facts.hopper = false;
  return facts;
}

void flash_attention_forward(const void* q, const void* k, const void* v, void* o, float* lse, Elem e, std::int64_t n,
                             std::int64_t tq, std::int64_t tk, int d, float scale, bool causal,
                             const FlashAttentionPlan& plan, float* workspace, cudaStream_t s) {
  check_head_dim(d);
  const float scale_log2 = scale * kLog2e;
  const long long kv_bytes = 2 * tk * d * 2;  // K and V in 16 bits, streamed under the tensor-core kernels' query tiles
  if (tensor_core_path(e, d)) {
    with_tensor_core_elem(e, [&](auto tag) {
      using E = typename decltype(tag)::type;
      if (!std::is_same_v<E, bf16> && plan.forward_wgmma)
        throw std::logic_error("flash attention: a plan put fp16 on the bf16-only Hopper forward");
      const int parts = plan.forward_parts;
      const long long q_elems = n * tq * d;
      const PartOut<E> o_out{static_cast<E*>(o), parts > 1 ? workspace : nullptr, q_elems};
      const PartOut<float> lse_out{lse, parts > 1 ? workspace + parts * q_elems : nullptr, n * tq};
      auto qb = static_cast<const E*>(q), kb = static_cast<const E*>(k), vb = static_cast<const E*>(v);
      with_tc_head_dim(d, [&](auto dc) {
        constexpr int D = decltype(dc)::value;
        if constexpr (kHopperHeadDim<D> && std::is_same_v<E, bf16>)
          if (plan.forward_wgmma) {
            return launch_tiled("flash_forward_wgmma",
                                parts > 1 ? flash_forward_wgmma<D, true> : flash_forward_wgmma<D, false>, kWgThreads,
                                forward_wgmma_smem<D>(), Tiling{n, tq, kWgTileQ, kv_bytes, parts}, s,
                                tile_map<D>(q, n, tq, kWgTileQ), tile_map<D>(k, n, tk, kForwardTileK<D>),
                                tile_map<D>(v, n, tk, kForwardTileK<D>), o_out, lse_out, static_cast<int>(tq),
                                static_cast<int>(tk), scale_log2, causal);
          }
        launch_tiled("flash_forward_tc", parts > 1 ? flash_forward_tc<E, D, true> : flash_forward_tc<E, D, false>,
                     kThreads, forward_tc_smem<D>(), Tiling{n, tq, kTileQ, kv_bytes, parts}, s, qb, kb, vb, o_out,
                     lse_out, static_cast<int>(tq), static_cast<int>(tk), scale_log2, causal);
      });
      if (parts > 1) {
        const long long rows = n * tq;
        combine_parts<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(workspace, workspace + parts * q_elems,
                                                                            parts, rows, d, static_cast<E*>(o), lse);
        check_launch("combine_parts");
      }
    });
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
    const T *out = static_cast<const T*>(o), *grad = static_cast<const T*>(dout);
    float* stats = plan.row_stats_rows > 0 ? row_stats : nullptr;
    constexpr int kVec = 16 / sizeof(T);
    int lanes = d % kVec == 0 && aligned16({out, grad}) ? 1 : 0;  // the fewest whole lanes a row holds
    while (lanes > 0 && lanes * kVec < d) lanes *= 2;
    // 8 warps a block: (32 / lanes) rows a warp, or one with the element-a-lane kernel.
    auto launch = [&](auto kernel, int rows_a_warp) {
      kernel<<<static_cast<unsigned>((n * padded + 8 * rows_a_warp - 1) / (8 * rows_a_warp)), 256, 0, s>>>(
          out, grad, lse, delta, stats, n, tq, padded, d);
    };
    // The packed kernel of `lanes` lanes a row (1 to 32, powers of two), else an element a lane.
    auto dispatch = [&](auto self, auto lanes_tried) {
      constexpr int kLanes = decltype(lanes_tried)::value;
      if (lanes == kLanes)
        launch(flash_delta_packed<T, kLanes>, 32 / kLanes);
      else if constexpr (kLanes < 32)
        self(self, std::integral_constant<int, 2 * kLanes>{});
      else
        launch(flash_delta<T>, 1);
    };
    dispatch(dispatch, std::integral_constant<int, 1>{});
  });
  check_launch("flash_delta");
  const int itq = static_cast<int>(tq), itk = static_cast<int>(tk);
  if (tensor_core_path(e, d)) {
    with_tensor_core_elem(e, [&](auto tag) {
      using E = typename decltype(tag)::type;
      if (!std::is_same_v<E, bf16> && (plan.dkdv_wgmma || plan.dq_wgmma))
        throw std::logic_error("flash attention: a plan put fp16 on the bf16-only Hopper backward");
      const long long kv_bytes = 2 * tk * d * 2, qdo_bytes = 2 * tq * d * 2;  // 16-bit K and V, Q and dO
      const bool atomics = plan.atomic_dq();
      if (atomics && cudaMemsetAsync(dq_accum, 0, sizeof(float) * n * plan.dq_accum_rows * d, s) != cudaSuccess)
        throw std::runtime_error("flash attention: clearing the dq accumulator failed");
      const int kv_parts = plan.dkdv_parts, q_parts = plan.dq_parts;
      const long long q_elems = n * tq * d, k_elems = n * tk * d;
      const PartOut<E> dk_out{static_cast<E*>(dk), kv_parts > 1 ? workspace : nullptr, k_elems},
          dv_out{static_cast<E*>(dv), kv_parts > 1 ? workspace + kv_parts * k_elems : nullptr, k_elems},
          dq_out{static_cast<E*>(dq), q_parts > 1 ? workspace : nullptr, q_elems};
      auto qb = static_cast<const E*>(q), kb = static_cast<const E*>(k), vb = static_cast<const E*>(v),
           gb = static_cast<const E*>(dout);
      with_tc_head_dim(d, [&](auto dc) {
        constexpr int D = decltype(dc)::value;
        bool dkdv_done = false;
        if constexpr (kHopperHeadDim<D> && std::is_same_v<E, bf16>)
          if (plan.dkdv_wgmma) {
            const CUtensorMap delta_rows = row_map(row_stats, n, plan.row_stats_rows, kWbTileQ),
                              lse_rows = row_map(row_stats + n * plan.row_stats_rows, n, plan.row_stats_rows, kWbTileQ);
            auto launch = [&](auto dkdv, int smem) {
              launch_tiled("flash_backward_wgmma", dkdv, kWgThreads, smem, Tiling{n, tk, kWbKeys, qdo_bytes, kv_parts},
                           s, tile_map<D>(q, n, tq, kWbTileQ), tile_map<D>(k, n, tk, kWbKeys),
                           tile_map<D>(v, n, tk, kWbKeys), tile_map<D>(dout, n, tq, kWbTileQ), lse_rows, delta_rows,
                           dk_out, dv_out, dq_accum, itq, itk, scale, causal);
            };
            const bool split = kv_parts > 1;
            if (atomics) {
              if constexpr (kHopperAtomicHeadDim<D>) {
                launch(split ? flash_backward_wgmma<D, true, true> : flash_backward_wgmma<D, true, false>,
                       wgmma_backward_smem<D, true>());
                const int tiles = static_cast<int>(plan.dq_accum_rows / kWbTileQ);
                const long long quads = n * plan.dq_accum_rows * D / 4;
                dq_from_tiles<D><<<static_cast<unsigned>((quads + 255) / 256), 256, 0, s>>>(
                    dq_accum, static_cast<bf16*>(dq), itq, tiles, quads, scale);
                check_launch("dq_from_tiles");
              } else {
                throw std::logic_error("flash attention: a plan put atomic dQ on a Hopper backward without it");
              }
            } else {
              launch(split ? flash_backward_wgmma<D, false, true> : flash_backward_wgmma<D, false, false>,
                     wgmma_backward_smem<D, false>());
            }
            dkdv_done = true;
          }
        if (!dkdv_done) {
          auto dkdv = atomics ? (kv_parts > 1 ? flash_backward_dkdv_tc<E, D, true, true>
                                              : flash_backward_dkdv_tc<E, D, true, false>)
                              : (kv_parts > 1 ? flash_backward_dkdv_tc<E, D, false, true>
                                              : flash_backward_dkdv_tc<E, D, false, false>);
          launch_tiled("flash_backward_dkdv_tc", dkdv, kThreads, dkdv_tc_smem<D>(),
                       Tiling{n, tk, kTileK, qdo_bytes, kv_parts}, s, qb, kb, vb, gb, lse, delta, dk_out, dv_out,
                       dq_accum, itq, itk, scale, causal);
        }
        if (kv_parts > 1) {
          add_parts_into<E>(dk, dk_out.parts, kv_parts, k_elems, s);
          add_parts_into<E>(dv, dv_out.parts, kv_parts, k_elems, s);
        }
        if (atomics) return;
        if constexpr (kHopperHeadDim<D> && std::is_same_v<E, bf16>)
          if (plan.dq_wgmma) {
            launch_tiled("flash_backward_dq_wgmma",
                         q_parts > 1 ? flash_backward_dq_wgmma<D, true> : flash_backward_dq_wgmma<D, false>, kWgThreads,
                         dq_wgmma_smem<D>(), Tiling{n, tq, kWgTileQ, kv_bytes, q_parts}, s,
                         tile_map<D>(q, n, tq, kWgTileQ), tile_map<D>(k, n, tk, kWgTileK),
                         tile_map<D>(v, n, tk, kWgTileK), tile_map<D>(dout, n, tq, kWgTileQ), lse, delta, dq_out, itq,
                         itk, scale, causal);
            if (q_parts > 1) add_parts_into<E>(dq, workspace, q_parts, q_elems, s);
            return;
          }
        launch_tiled("flash_backward_dq_tc",
                     q_parts > 1 ? flash_backward_dq_tc<E, D, true> : flash_backward_dq_tc<E, D, false>, kThreads,
                     dq_tc_smem<D>(), Tiling{n, tq, kTileQ, kv_bytes, q_parts}, s, qb, kb, vb, gb, lse, delta, dq_out,
                     itq, itk, scale, causal);
        if (q_parts > 1) add_parts_into<E>(dq, workspace, q_parts, q_elems, s);
      });
      if (atomics && !plan.dkdv_wgmma) cast(dq_accum, Elem::f32, dq, e, n * tq * d, s);
    });
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
