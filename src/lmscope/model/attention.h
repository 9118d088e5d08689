// Scaled dot-product attention over heads-major tensors, in the two forms lmscope compares:
// naive (scores and probabilities materialised, as the seeds' PyTorch code does) and flash
// (FlashAttention-2: only the output and the log-sum-exp are kept). The model and the attention
// benchmark both call these, so both measure the same code.
#pragma once

#include "lmscope/backend/backend.h"

#include <string>

namespace lmscope {

enum class AttentionKind { naive, flash };
AttentionKind parse_attention(const std::string& name);  // "naive" or "flash"; UserError otherwise
const char* attention_name(AttentionKind kind);

// What the forward keeps for the backward, tagged as activations of its layer.
struct AttentionSaved {
  Allocation probs;  // naive: [n, T, T] softmax output, compute dtype
  Allocation lse;    // flash: [n, T] log-sum-exp, the statistics dtype
};

struct AttentionCall {
  AttentionKind kind = AttentionKind::flash;
  bool causal = true;
  // flash backward: how dq is summed over key tiles. The model's default keeps training runs
  // repeatable bit for bit; `lmscope attention` asks for the fastest, as SDPA's backward sums dq by
  // atomics too (docs/flash-attention.md).
  FlashDq dq = FlashDq::deterministic;
  DType stats = DType::f32;  // dtype of the log-sum-exp
  int layer = -1;            // for the allocation tags
};

// q, k, v [n, T, dk] -> o [n, T, dk], scale 1/√dk.
void attention_forward(Backend& backend, const AttentionCall& call, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& o, AttentionSaved& saved);
// dq, dk, dv (overwritten) from dout; o is the forward's output (flash reads it, naive does not).
// Frees what the forward saved. Returns how dq was summed (naive: deterministic).
FlashDq attention_backward(Backend& backend, const AttentionCall& call, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor& o, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                           const Tensor& dv, AttentionSaved& saved);

}  // namespace lmscope
