#include "lmscope/backend/op_scratch.h"

#include <algorithm>
#include <limits>

namespace lmscope::scratch {
namespace {

// fp32 scratch of `floats` elements for one call (none for 0), counted as workspace.
Allocation floats(Allocator& mem, std::int64_t n, const char* what) {
  if (n == 0) return {};
  return mem.allocate({n}, DType::f32, {MemKind::workspace, what, -1});
}

}  // namespace

Allocation cpu_flash_backward(Allocator& mem, const AttentionShape& s, DType dtype) {
  return mem.allocate({s.n, s.tq}, dtype, {MemKind::workspace, "flash.delta", -1});
}

void cuda_flash_limits(const AttentionShape& s) {
  if (s.d > 128) throw Unsupported(fmt::format("flash attention on CUDA takes head dims up to 128, not {}", s.d));
  if (s.tq > (1 << 30) || s.tk > (1 << 30)) throw Unsupported("flash attention on CUDA takes up to 2^30 positions");
  // One CTA per sequence and tile (32 rows at the least) in a one-dimensional grid.
  if (s.n * ((std::max(s.tq, s.tk) + 31) / 32) > std::numeric_limits<int>::max())
    throw Unsupported(fmt::format("flash attention on CUDA takes up to 2^31 tiles of 32 rows, not {} sequences of {}",
                                  s.n, std::max(s.tq, s.tk)));
}

FlashAttentionPlan cuda_flash_backward_plan(const FlashKernelFacts& gpu, Elem e, const AttentionShape& s, bool causal,
                                            FlashDq dq_sum) {
  const int d = static_cast<int>(s.d);
  return dq_sum == FlashDq::fastest
             ? flash_attention_fastest_plan(gpu, e, d, s.n, s.tq, s.tk, causal)
             : flash_attention_plan(gpu, e, d, s.n, s.tq, s.tk, causal, dq_sum == FlashDq::deterministic);
}

Allocation cuda_flash_forward(Allocator& mem, const FlashAttentionPlan& plan) {
  return floats(mem, plan.forward_workspace, "flash.parts");
}

CudaFlashBackward cuda_flash_backward(Allocator& mem, const FlashAttentionPlan& plan, const AttentionShape& s) {
  CudaFlashBackward w;
  w.delta = mem.allocate({s.n, s.tq}, DType::f32, {MemKind::workspace, "flash.delta", -1});
  w.row_stats = floats(mem, 2 * s.n * plan.row_stats_rows, "flash.row_stats");
  w.dq_accum = floats(mem, s.n * plan.dq_accum_rows * s.d, "flash.dq_accum");
  w.parts = floats(mem, plan.backward_workspace, "flash.parts");
  return w;
}

Allocation cuda_cross_entropy(Allocator& mem, std::int64_t rows) {
  return mem.allocate({rows}, DType::f32, {MemKind::workspace, "cross_entropy.row_loss", -1});
}

Allocation cuda_rmsnorm_backward(Allocator& mem, std::int64_t rows, std::int64_t d) {
  if (rows < kRmsNormDwBlocks * kRmsNormDwMinRows || d > kRmsNormDwMaxD) return {};
  return floats(mem, kRmsNormDwBlocks * d, "rmsnorm.dw_partials");
}

Allocation cuda_global_norm(Allocator& mem, std::size_t tensors) {
  return mem.allocate({static_cast<std::int64_t>(tensors) * kGlobalNormBlocks}, DType::f64,
                      {MemKind::workspace, "global_norm.partials", -1});
}

Allocation cuda_gemm_workspace(Allocator& mem) {
  return mem.allocate_apart({static_cast<std::int64_t>(kCublasLtWorkspaceBytes / sizeof(float))}, DType::f32,
                            {MemKind::workspace, "cublaslt.workspace", -1});
}

std::pair<const Tensor*, bool> RopeTables::get(Allocator& mem, std::int64_t t, std::int64_t dk, double theta) {
  if (theta <= 0) return {nullptr, false};
  LMSCOPE_CHECK(dk % 2 == 0, "RoPE needs an even head dim, got {}", dk);
  const Key key{t, dk, theta};
  for (auto& [k, table] : tables_)
    if (k == key) return {&table.tensor(), false};
  tables_.emplace_back(key, mem.allocate({t, dk / 2, 2}, DType::f32, {MemKind::workspace, "rope.table", -1}));
  return {&tables_.back().second.tensor(), true};
}

}  // namespace lmscope::scratch
