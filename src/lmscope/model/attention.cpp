#include "lmscope/model/attention.h"

#include <cmath>

namespace lmscope {
namespace {

// One product per sequence: C = op(A)·op(B), operands [n, rows, cols] contiguous.
void batched_gemm(Backend& backend, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const Tensor& a,
                  const Tensor& b, const Tensor& c) {
  backend.gemm(GemmArgs::packed(ta, tb, m, n, k, a, b, c, 0, c.dim(0)));
}

double scale_of(const Tensor& q) { return 1.0 / std::sqrt(static_cast<double>(q.dim(-1))); }

Allocation allocate(Backend& backend, const char* what, int layer, Shape shape, DType dtype,
                    std::source_location where = std::source_location::current()) {
  return backend.allocator().allocate(std::move(shape), dtype, {MemKind::activation, what, layer}, where);
}

}  // namespace

AttentionKind parse_attention(const std::string& name) {
  if (name == "naive") return AttentionKind::naive;
  if (name == "flash") return AttentionKind::flash;
  user_error("unknown attention '{}' (use naive or flash)", name);
}

const char* attention_name(AttentionKind kind) { return kind == AttentionKind::naive ? "naive" : "flash"; }

void attention_forward(Backend& backend, const AttentionCall& call, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& o, AttentionSaved& saved) {
  const std::int64_t n = q.dim(0), T = q.dim(1), dk = q.dim(2);
  if (call.kind == AttentionKind::flash) {
    saved.lse = allocate(backend, "attn.lse", call.layer, {n, T}, call.stats);
    backend.flash_attention_forward(q, k, v, o, saved.lse, scale_of(q), call.causal);
    return;
  }
  // S = Q·Kᵀ, P = softmax(S/√dk), O = P·V
  Allocation scores = allocate(backend, "attn.scores", call.layer, {n, T, T}, q.dtype);
  batched_gemm(backend, false, true, T, T, dk, q, k, scores);
  saved.probs = allocate(backend, "attn.probs", call.layer, {n, T, T}, q.dtype);
  backend.softmax_forward(scores, saved.probs, scale_of(q), call.causal);
  scores.reset();
  batched_gemm(backend, false, false, T, dk, T, saved.probs, v, o);
}

FlashDq attention_backward(Backend& backend, const AttentionCall& call, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor& o, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                           const Tensor& dv, AttentionSaved& saved) {
  const std::int64_t n = q.dim(0), T = q.dim(1), d = q.dim(2);
  if (call.kind == AttentionKind::flash) {
    LMSCOPE_CHECK(!saved.lse.empty(), "flash attention backward without its forward");
    const FlashDq used =
        backend.flash_attention_backward(q, k, v, o, saved.lse, dout, dq, dk, dv, scale_of(q), call.causal, call.dq);
    saved.lse.reset();
    return used;
  }
  LMSCOPE_CHECK(!saved.probs.empty(), "naive attention backward without its forward");
  Allocation dscores = allocate(backend, "grad.attn.scores", call.layer, {n, T, T}, q.dtype);
  batched_gemm(backend, false, true, T, T, d, dout, v, dscores);         // dP = dO·Vᵀ
  batched_gemm(backend, true, false, T, d, T, saved.probs, dout, dv);    // dV = Pᵀ·dO
  backend.softmax_backward(saved.probs, dscores, dscores, scale_of(q));  // dS, scale folded in
  saved.probs.reset();
  batched_gemm(backend, false, false, T, d, T, dscores, k, dq);  // dQ = dS·K
  batched_gemm(backend, true, false, T, d, T, dscores, q, dk);   // dK = dSᵀ·Q
  return FlashDq::deterministic;
}

}  // namespace lmscope
