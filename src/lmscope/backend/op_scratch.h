// The scratch each backend's ops take from the allocator beyond their operands, in the order they
// take it. Written once here, so that the shape-only backend of the dry run, standing for a device,
// allocates exactly what that device's backend does (the tests compare the two records event by
// event, on the CPU in CI and on the GPU on the H100).
#pragma once

#include "lmscope/backend/backend.h"
#include "lmscope/device/flash_plan.h"

#include <utility>
#include <vector>

namespace lmscope::scratch {

// CPU: the flash backward's delta = rowsum(dO∘O) [n, tq] in the operands' type.
Allocation cpu_flash_backward(Allocator& mem, const AttentionShape& s, DType dtype);

// CUDA. What its flash attention refuses (Unsupported): head dims over 128, more than 2^30
// positions, more than 2^31 tiles of 32 rows.
void cuda_flash_limits(const AttentionShape& s);
struct CudaFlashBackward {
  Allocation delta, row_stats, dq_accum, parts;
};
FlashAttentionPlan cuda_flash_backward_plan(const FlashKernelFacts& gpu, Elem e, const AttentionShape& s, bool causal,
                                            FlashDq dq_sum);
Allocation cuda_flash_forward(Allocator& mem, const FlashAttentionPlan& plan);
CudaFlashBackward cuda_flash_backward(Allocator& mem, const FlashAttentionPlan& plan, const AttentionShape& s);
Allocation cuda_cross_entropy(Allocator& mem, std::int64_t rows);  // per-row losses [rows] f32
// RMSNorm's backward on `rows` rows of d: where each of kRmsNormDwBlocks blocks gets at least
// kRmsNormDwMinRows rows and a row's sums fit the 48 KiB of shared memory a block has without asking
// (4 bytes a column, beside the block reduction's 128), the dx kernel also sums the weight gradient's
// terms, a block's into a row of these partials [kRmsNormDwBlocks, d] f32, and a second kernel adds
// the rows (cuda::rmsnorm_backward). Else none are made (empty) and the dw kernel reads dy and x
// again. Two rows a block (2048 rows: batch 4 at ctx 512) paid on an H100; fewer blocks for fewer rows
// did not (docs/speed.md).
inline constexpr std::int64_t kRmsNormDwBlocks = 1024, kRmsNormDwMinRows = 2, kRmsNormDwMaxD = 12224;
Allocation cuda_rmsnorm_backward(Allocator& mem, std::int64_t rows, std::int64_t d);
// The global norm's f64 partial sums, kGlobalNormBlocks per tensor (cuda::sum_squares).
inline constexpr std::int64_t kGlobalNormBlocks = 256;
// The parameters the fused AdamW step updates in one launch (cuda::adamw_many): its copies are made
// a group at a time (Backend::adamw_all).
inline constexpr std::size_t kCudaAdamWGroup = 24;
Allocation cuda_global_norm(Allocator& mem, std::size_t tensors);
// cuBLASLt's workspace, made at a backend's first GEMM and held for its life (cuda/gemm.h): counted
// as workspace in the allocator's record, on the GPU and in its dry run alike.
inline constexpr std::size_t kCublasLtWorkspaceBytes = std::size_t(32) << 20;
Allocation cuda_gemm_workspace(Allocator& mem);

// RoPE's (cos, sin) table [t, dk/2, 2] f32 per (t, dk, theta), made on a shape's first use and kept.
class RopeTables {
 public:
  // The table, and whether it was made by this call (and so needs filling); none for theta <= 0.
  std::pair<const Tensor*, bool> get(Allocator& mem, std::int64_t t, std::int64_t dk, double theta);

 private:
  struct Key {
    std::int64_t t, dk;
    double theta;
    bool operator==(const Key&) const = default;
  };
  std::vector<std::pair<Key, Allocation>> tables_;
};

}  // namespace lmscope::scratch
