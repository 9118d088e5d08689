// How one flash-attention call runs on a GPU, decided on the host: which kernel of each pass, into
// how many parts each CTA's inner loop is cut, and the scratch the call takes, as a pure function of
// the call's shape and the GPU's description (FlashKernelFacts, device_facts.h). Plain C++17 (no CUDA
// headers; nvcc reads it too), so that the shape-only dry run, on a machine without a GPU, plans
// exactly as the GPU would from a stored copy of those facts.
#pragma once

#include "lmscope/device/device_facts.h"

#include <cstdint>

namespace lmscope {

// The storage type of a tensor as the CUDA kernels take it (device/storage_elem.h maps a DType).
enum class Elem { f32, bf16, f16 };

// Tile rows the plan counts with; flash_attention.cu checks its kernels' constants against these.
inline constexpr int kPlanSyncTile = 64;         // mma.sync kernels: queries and keys per CTA tile
inline constexpr int kPlanHopperTile = 128;      // wgmma kernels: queries (forward, dQ) or keys (dK/dV) per CTA
inline constexpr int kPlanHopperQueryTile = 64;  // wgmma dK/dV kernel: queries per inner tile

// How one call runs, per tensor-core kernel: whether it is the Hopper one (wgmma: bf16, d 32, 64 or
// 128 on a Hopper GPU, with 128-row CTAs for at least 7/8 of the SMs) or mma.sync, and into how
// many parts each CTA's inner loop is cut (more than one when the call has too few tiles to fill
// the GPU: tile_order.h). Parts write fp32 results to a workspace that a second kernel adds up.
// The CUDA-core path has one part.
struct FlashAttentionPlan {
  bool forward_wgmma = false, dkdv_wgmma = false, dq_wgmma = false;  // dq: the deterministic dQ pass
  int forward_parts = 1, dkdv_parts = 1, dq_parts = 1;
  // Rows of the fp32 dq accumulator [n, rows, d] with atomics on the tensor-core path (tq, or tq
  // rounded up to whole 64-query tiles for the Hopper kernel, which adds tiles in its own order); 0
  // where none is needed: dq is then summed by its own pass, in a fixed order.
  std::int64_t dq_accum_rows = 0;
  bool atomic_dq() const { return dq_accum_rows > 0; }
  // Rows per sequence of the Hopper dK/dV kernel's copy of delta and L (in log2 units) [2, n, rows]
  // fp32: tq rounded up to whole 64-query tiles, so that the copy engine reads whole aligned runs;
  // 0 where that kernel does not run.
  std::int64_t row_stats_rows = 0;
  std::int64_t forward_workspace = 0, backward_workspace = 0;  // fp32 elements of the parts, 0: none
};

// Head dims the tensor-core kernels are built for, those with Hopper kernels too, and those whose
// Hopper backward also sums dQ by atomics (bulk reductions; at d 80 only its own pass does).
bool tensor_core_head_dim(int d);
bool hopper_head_dim(int d);
bool hopper_atomic_head_dim(int d);

// deterministic: dq by its own pass; false: accumulated by atomics where the tensor-core path runs.
FlashAttentionPlan flash_attention_plan(const FlashKernelFacts& gpu, Elem e, int d, std::int64_t n, std::int64_t tq,
                                        std::int64_t tk, bool causal, bool deterministic);
// The faster of the two (FlashDq::fastest): atomics where the Hopper dK/dV kernel runs, whose bulk
// reductions cost less than a second pass over S and dP; its own pass on mma.sync, whose fp32
// atomics cost more (measured: docs/log/flash-attention.md, steps 22-24, 32-33 and 37).
FlashAttentionPlan flash_attention_fastest_plan(const FlashKernelFacts& gpu, Elem e, int d, std::int64_t n,
                                                std::int64_t tq, std::int64_t tk, bool causal);

}  // namespace lmscope
