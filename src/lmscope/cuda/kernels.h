// Launchers of lmscope's own CUDA kernels, one per backend op. Each takes raw device pointers,
// the storage type of the tensors whose type can vary (Elem), and sizes, and enqueues on the given
// stream; shapes are the backend's to check. Arithmetic is fp32 whatever the storage.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lmscope::cuda {

enum class Elem { f32, bf16 };

// elementwise.cu
void fill(void* x, Elem ex, std::int64_t n, float value, cudaStream_t s);
void cast(const void* in, Elem ein, void* out, Elem eout, std::int64_t n, cudaStream_t s);
// out = a + b
void add(const void* a, Elem ea, const void* b, Elem eb, void* out, Elem eout, std::int64_t n, cudaStream_t s);
void swiglu_forward(const void* a, const void* b, void* out, Elem e, std::int64_t n, cudaStream_t s);
void swiglu_backward(const void* a, const void* b, const void* dout, void* da, void* db, Elem e, std::int64_t n,
                     cudaStream_t s);
// fp32 p, g, m, v. grad_norm: device pointer to the global norm (nullptr when max_norm <= 0);
// alpha = the bias-corrected step size; decay = lr·weight_decay; lowp: a bf16 copy of p to
// refresh in the same pass, or nullptr.
void adamw(float* p, const float* g, float* m, float* v, std::int64_t n, float beta1, float beta2, float eps,
           float alpha, float decay, const float* grad_norm, float max_norm, void* lowp, cudaStream_t s);
// accumulates Σx² of x into *sum (double, zeroed by the caller).
void sum_squares(const float* x, std::int64_t n, double* sum, cudaStream_t s);
void sqrt_to_float(const double* sum, float* out, cudaStream_t s);

// rowwise.cu (x, weights, rstd, lse and the losses are fp32; the rest has the storage named)
void embedding_forward(const std::int32_t* ids, const float* table, float* out, std::int64_t n, std::int64_t d,
                       cudaStream_t s);
void embedding_backward(const std::int32_t* ids, const float* dout, float* dtable, std::int64_t n, std::int64_t v,
                        std::int64_t d, cudaStream_t s);
void rmsnorm_forward(const float* x, const float* w, void* out, Elem eout, float* rstd, std::int64_t n, std::int64_t d,
                     float eps, cudaStream_t s);
void rmsnorm_backward(const void* dout, Elem edout, const float* x, const float* w, const float* rstd, float* dx,
                      float* dw, std::int64_t n, std::int64_t d, cudaStream_t s);
void softmax_forward(const void* scores, void* probs, Elem e, std::int64_t rows, std::int64_t tq, std::int64_t tk,
                     float scale, bool causal, cudaStream_t s);
void softmax_backward(const void* probs, const void* dprobs, void* dscores, Elem e, std::int64_t rows, std::int64_t tk,
                      float scale, cudaStream_t s);
// row_loss: scratch [n] for per-row losses, reduced in a fixed order into *loss.
void cross_entropy_forward(const void* logits, Elem e, const std::int32_t* targets, float* lse, float* row_loss,
                           float* loss, std::int64_t n, std::int64_t v, cudaStream_t s);
void cross_entropy_backward(const void* logits, const std::int32_t* targets, const float* lse, void* dlogits, Elem e,
                            std::int64_t n, std::int64_t v, float scale, cudaStream_t s);

// heads.cu: the RoPE table [t, dk/2] of (cos, sin) of p·theta^(-2i/dk), formed in double.
void rope_table(float* table, std::int64_t t, std::int64_t dk, double theta, cudaStream_t s);
// [B, T, h, dk] <-> [B, h, T, dk], rotating pairs by the table (inverse rotation when merging back);
// rope nullptr: no rotation. dk is even.
void permute_heads(const void* in, void* out, Elem e, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t dk,
                   const float* rope, bool to_heads_major, cudaStream_t s);

// flash_attention.cu: FlashAttention-2. q [n, tq, d], k and v [n, tk, d], o [n, tq, d] in the
// storage named; lse [n, tq] fp32 (natural log of Σ exp(scale·s)); causal masks key j > query i.
// Tensor cores for bf16 with d in {16, 32, 64, 80, 96, 128}; CUDA cores otherwise (d ≤ 128).
bool flash_attention_supports(int d);
// How one call runs (flash_attention_plan), per tensor-core kernel: whether it is the Hopper one
// (wgmma: bf16, d 32, 64 or 128, an sm_90a binary on a Hopper GPU, and 128-row CTAs for at least 7/8
// of the SMs) or mma.sync, and into how many parts each CTA's inner loop is cut (more than one when
// the call has too few tiles to fill the GPU: src/lmscope/cuda/tile_order.h). Parts write fp32
// results to a workspace that a second kernel adds up. The CUDA-core path has one part.
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
// deterministic: dq by its own pass; false: accumulated by atomics where the tensor-core path runs.
FlashAttentionPlan flash_attention_plan(Elem e, int d, std::int64_t n, std::int64_t tq, std::int64_t tk, bool causal,
                                        bool deterministic);
// The faster of the two (FlashDq::fastest): atomics where the Hopper dK/dV kernel runs, whose bulk
// reductions cost less than a second pass over S and dP; its own pass on mma.sync, whose fp32
// atomics cost more (measured: docs/flash-attention.md, steps 22-24, 32-33 and 37).
FlashAttentionPlan flash_attention_fastest_plan(Elem e, int d, std::int64_t n, std::int64_t tq, std::int64_t tk,
                                                bool causal);
// workspace: plan.forward_workspace floats (null where 0).
void flash_attention_forward(const void* q, const void* k, const void* v, void* o, float* lse, Elem e, std::int64_t n,
                             std::int64_t tq, std::int64_t tk, int d, float scale, bool causal,
                             const FlashAttentionPlan& plan, float* workspace, cudaStream_t s);
// delta: [n, tq] fp32 scratch; row_stats: [2, n, plan.row_stats_rows]; dq_accum: [n, plan.dq_accum_rows, d];
// workspace: plan.backward_workspace floats (each null where its size is 0).
void flash_attention_backward(const void* q, const void* k, const void* v, const void* o, const float* lse,
                              const void* dout, void* dq, void* dk, void* dv, Elem e, std::int64_t n, std::int64_t tq,
                              std::int64_t tk, int d, float scale, bool causal, const FlashAttentionPlan& plan,
                              float* delta, float* row_stats, float* dq_accum, float* workspace, cudaStream_t s);

}  // namespace lmscope::cuda
