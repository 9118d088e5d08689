// Launchers of lmscope's own CUDA kernels, one per backend op. Each takes raw device pointers,
// the storage type of the tensors whose type can vary (Elem), and sizes, and enqueues on the given
// stream; shapes are the backend's to check. Arithmetic is fp32 whatever the storage.
#pragma once

#include "lmscope/device/flash_plan.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace lmscope::cuda {

// elementwise.cu
void fill(void* x, Elem ex, std::int64_t n, float value, cudaStream_t s);
void cast(const void* in, Elem ein, void* out, Elem eout, std::int64_t n, cudaStream_t s);
// out = a + b
void add(const void* a, Elem ea, const void* b, Elem eb, void* out, Elem eout, std::int64_t n, cudaStream_t s);
void swiglu_forward(const void* a, const void* b, void* out, Elem e, std::int64_t n, cudaStream_t s);
void swiglu_backward(const void* a, const void* b, const void* dout, void* da, void* db, Elem e, std::int64_t n,
                     cudaStream_t s);

// optimizer.cu: AdamW and the global norm, per tensor and over many a launch (the fused step).
// AdamW's constants. alpha = the bias-corrected step size, decay = lr·weight_decay; grad_scale
// multiplies g first (and the norm the clipping compares); the three are replaced by step_scalars[0..2]
// when those are given (on the device, so a recorded graph replays each step's). The norm clips when
// max_norm > 0; skip_nonfinite leaves p, m and v as they are when the norm is not finite.
struct AdamWConsts {
  float beta1, beta2, eps;
  float alpha, decay, grad_scale;
  float max_norm;
  bool skip_nonfinite;
};
// p, m, v in ep: f32, with g in eg (f32, or bf16 with --grad-dtype bf16); or bf16 (--master-dtype
// bf16), with g bf16 and no copy. grad_norm: device pointer to the global norm (nullptr when neither
// clipping nor skipping reads it); lowp: a copy of p in elow (bf16 or f16) to refresh in the same
// pass, or nullptr.
void adamw(void* p, Elem ep, const void* g, Elem eg, void* m, void* v, std::int64_t n, const AdamWConsts& c,
           const float* step_scalars, const float* grad_norm, void* lowp, Elem elow, cudaStream_t s);
// The global norm, deterministic: sum_squares writes kNormBlocks partial sums of x² (one per block)
// at `partials`; sum_partials_sqrt adds `count` of them in a fixed order into √Σ. x in ex (f32 or bf16).
inline constexpr int kNormBlocks = 256;
void sum_squares(const void* x, Elem ex, std::int64_t n, double* partials, cudaStream_t s);
void sum_partials_sqrt(const double* partials, std::int64_t count, float* out, cudaStream_t s);

// The fused step: the same per tensor as sum_squares and adamw, up to kTensorsPerLaunch tensors a launch
// (the copies of one launch all in the same elow). sum_squares_many writes tensor i's partials at
// partials + i·kNormBlocks.
inline constexpr int kTensorsPerLaunch = 24;
struct AdamWTensor {
  void* p;        // p, m and v in ep, the same for every tensor of a launch
  const void* g;  // in eg, the same for every tensor of a launch
  void* m;
  void* v;
  std::int64_t n;
  void* lowp = nullptr;  // as adamw's lowp
  Elem elow = Elem::bf16;
  Elem eg = Elem::f32;
  Elem ep = Elem::f32;
};
void sum_squares_many(const void* const* x, Elem ex, const std::int64_t* n, std::int64_t count, double* partials,
                      cudaStream_t s);
void adamw_many(const AdamWTensor* tensors, std::int64_t count, const AdamWConsts& c, const float* step_scalars,
                const float* grad_norm, cudaStream_t s);
// Pair i's n elements of `in` into `out`, every pair from ein to eout, up to kTensorsPerLaunch pairs a
// launch: the bits of cast() pair by pair.
struct CastPair {
  const void* in;
  void* out;
  std::int64_t n;
};
void cast_many(const CastPair* pairs, std::int64_t count, Elem ein, Elem eout, cudaStream_t s);
// Triple i's n elements: out = a + b, all of one dtype, up to kTensorsPerLaunch triples a launch: the
// bits of add() triple by triple.
struct AddTriple {
  const void* a;
  const void* b;
  void* out;
  std::int64_t n;
};
void add_many(const AddTriple* triples, std::int64_t count, Elem e, cudaStream_t s);

// rowwise.cu and embedding.cu. The residual stream's tensors (x, h, dx, dresidual), the norms' weights, the embedding's
// table and its rows are of the master dtype, ew: f32, or bf16 (--master-dtype bf16), which takes the
// rest in bf16 too. rstd, lse, the losses and the weight gradients written here (dtable, dw) are f32;
// the rest has the storage named.
void embedding_forward(const std::int32_t* ids, const void* table, void* out, Elem ew, std::int64_t n, std::int64_t d,
                       cudaStream_t s);
void embedding_backward(const std::int32_t* ids, const void* dout, Elem ew, float* dtable, std::int64_t n,
                        std::int64_t v, std::int64_t d, bool accumulate, cudaStream_t s);
void rmsnorm_forward(const void* x, const void* w, Elem ew, void* out, Elem eout, float* rstd, std::int64_t n,
                     std::int64_t d, float eps, cudaStream_t s);
// h = x + y (y stored as ey), then the RMSNorm of h: add and rmsnorm_forward's values in one pass.
void add_rmsnorm_forward(const void* x, const void* y, Elem ey, void* h, const void* w, Elem ew, void* out, Elem eout,
                         float* rstd, std::int64_t n, std::int64_t d, float eps, cudaStream_t s);
// dresidual (nullable): added to dx in the same pass, as add after the backward would. dw_partials
// (nullable, [kRmsNormDwBlocks, d]): the dx kernel also sums dy·x·r over its rows, a block's sums a row
// of them, then dw adds the rows; without, a second kernel reads dy and x again for dw. dx_lowp
// (nullable, stored as edout): dx rounded as a cast to that type would round it, from the same pass.
inline constexpr int kRmsNormDwBlocks = 1024;
void rmsnorm_backward(const void* dout, Elem edout, const void* x, const void* w, Elem ew, const float* rstd,
                      const void* dresidual, void* dx, void* dx_lowp, float* dw, float* dw_partials, std::int64_t n,
                      std::int64_t d, cudaStream_t s);
void softmax_forward(const void* scores, void* probs, Elem e, std::int64_t rows, std::int64_t tq, std::int64_t tk,
                     float scale, bool causal, cudaStream_t s);
void softmax_backward(const void* probs, const void* dprobs, void* dscores, Elem e, std::int64_t rows, std::int64_t tk,
                      float scale, cudaStream_t s);
// row_loss: scratch [n] for per-row losses, reduced in a fixed order; *loss = scale · their sum, added
// to *loss when accumulate.
void cross_entropy_forward(const void* logits, Elem e, const std::int32_t* targets, float* lse, float* row_loss,
                           float* loss, std::int64_t n, std::int64_t v, float scale, bool accumulate, cudaStream_t s);
void cross_entropy_backward(const void* logits, const std::int32_t* targets, const float* lse, void* dlogits, Elem e,
                            std::int64_t n, std::int64_t v, float scale, cudaStream_t s);

// heads.cu: the RoPE table [t, dk/2] of (cos, sin) of p·theta^(-2i/dk), formed in double.
void rope_table(float* table, std::int64_t t, std::int64_t dk, double theta, cudaStream_t s);
// [B, T, h, dk] <-> [B, h, T, dk], rotating pairs by the table (inverse rotation when merging back);
// rope nullptr: no rotation. dk is even. Up to kMaxHeadMoves tensors of the same shape in a launch.
struct HeadMove {
  const void* in;
  void* out;
  const float* rope;
};
inline constexpr int kMaxHeadMoves = 3;
void permute_heads(const HeadMove* moves, int count, Elem e, std::int64_t b, std::int64_t t, std::int64_t h,
                   std::int64_t dk, bool to_heads_major, cudaStream_t s);

// flash_attention.cu: FlashAttention-2. q [n, tq, d], k and v [n, tk, d], o [n, tq, d] in the
// storage named; lse [n, tq] fp32 (natural log of Σ exp(scale·s)); causal masks key j > query i.
// Tensor cores for bf16 and f16 with d in {16, 32, 64, 80, 96, 128}; CUDA cores otherwise (d ≤ 128).
bool flash_attention_supports(int d);
// The facts the plan reads (device/flash_plan.h) of the current GPU, asked of the driver once per
// device; the Hopper kernels count as absent with LMSCOPE_NO_WGMMA=1, which picks the mma.sync
// kernels for comparison. A backend plans with its Device's (cuda_device reads them here).
FlashKernelFacts flash_kernel_facts();
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

// held_sms.cu: a stand-in for a collective's kernels, to time GEMMs beside them (gemm.cpp): `sms`
// blocks on `holder`, one SM each, each held for `ms` from its start; work enqueued on `waiter` after
// this call starts once every block has (*arrived, a device int, counts them; reset first).
void hold_sms(int sms, double ms, int* arrived, cudaStream_t holder, cudaStream_t waiter);

}  // namespace lmscope::cuda
