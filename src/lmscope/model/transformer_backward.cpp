// The Transformer's backward: from the loss through every layer in reverse, consuming and freeing what
// the forward saved (saved_activations.h), each parameter's gradient made as it is reached.
#include "lmscope/core/hash.h"
#include "lmscope/model/saved_activations.h"
#include "lmscope/model/transformer.h"

namespace lmscope {

// dx [N, in] (= or +=, by beta) dy [N, out] · W.
void Transformer::linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& dx, float beta) {
  const std::int64_t in = w.dim(1), out = w.dim(0), n = dy.numel() / out;
  backend_.gemm(GemmArgs::packed(false, false, n, in, out, dy, w, dx, beta));
}

// dW [out, in] = dyᵀ · x, or += when accumulating micro-batches. Each weight is used once per
// forward, so otherwise the gradient is overwritten.
void Transformer::linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& dw, bool add) {
  const std::int64_t in = dw.dim(1), out = dw.dim(0), n = dy.numel() / out;
  backend_.gemm(GemmArgs::packed(true, false, out, in, n, dy, x, dw, add ? 1.0f : 0.0f));
}

template <typename Op>
void Transformer::parameter_gradient(Parameter* p, Op&& op) {
  if (!accumulating_ && grad_dtype_ == stats_dtype()) {
    op(gradient(*p));
    return;
  }
  Allocation part = backend_.allocator().allocate(
      p->spec.shape, stats_dtype(),
      {MemKind::workspace, accumulating_ ? "grad.accumulate" : "grad.wide", p->spec.layer});
  op(part.tensor());
  if (accumulating_)
    backend_.add(p->grad, part, p->grad);
  else
    backend_.cast(part, gradient(*p));
}

Allocation Transformer::norm_backward_add(Parameter* norm, const Tensor& dn, const Tensor& x, const Tensor& rstd,
                                          const Tensor& dresidual, const Tensor& dx, const char* lowp_name, int reader,
                                          std::source_location where) {
  Allocation lowp;
  if (fusion_ && compute_ != dx.dtype && lowp_name) lowp = act(lowp_name, reader, dx.shape, where);
  parameter_gradient(norm, [&](const Tensor& dw) {
    if (fusion_)
      backend_.rmsnorm_backward_add(dn, x, norm->value, rstd, dresidual, dx, dw, lowp);
    else
      backend_.rmsnorm_backward(dn, x, norm->value, rstd, dx, dw);
  });
  if (!fusion_) backend_.add(dx, dresidual, dx);
  return lowp;
}

void Transformer::backward(MicroBatch micro) {
  LMSCOPE_CHECK(!saved_.empty() && saved_.back().for_backward, "backward without a forward that kept its activations");
  LMSCOPE_CHECK(micro.count >= 1 && micro.index >= 0 && micro.index < micro.count, "backward of micro-batch {} of {}",
                micro.index, micro.count);
  const bool accumulate = micro.index > 0;
  LMSCOPE_CHECK(!accumulate || !params_.front().grad.empty(), "accumulating into gradients no backward has made");
  accumulating_ = accumulate;
  last_micro_batch_ = micro.index == micro.count - 1;
  const int micro_batches = micro.count;
  const std::int64_t B = batch_, T = ctx_, N = B * T, d = config_.d_model, dk = config_.d_head();
  const double theta = config_.rope_theta;
  Allocator& mem = backend_.allocator();
  mem.set_phase(Phase::backward);
  Saved s = std::move(saved_.back());
  saved_.clear();
  GraphScope graph(backend_, graphs(),
                   hash_mix(hash_mix(hash_mix(hash_mix(graph_key("backward"), s.graph_key), loss_scale_),
                                     std::uint64_t(micro.index > 0)),
                            std::uint64_t(micro.count) << 1 | std::uint64_t(last_micro_batch_)));

  // Loss and head: each logits buffer turns into dlogits in place, a chunk at a time when the forward
  // made them in chunks (then made again here from ln_final's output).
  RangeListener* ranges = backend_.range_listener();
  std::optional<HookedStretch> hooked_head(std::in_place, *hooks_, head_stretch_, Pass::backward);
  OpRanges head(ranges);
  head.next("lm_head and loss");
  const double dlogits_scale = loss_scale_ / static_cast<double>(N * micro_batches);
  Allocation dn = act("grad.ln_final.out", -1, {N, d});
  const std::int64_t rows = s.logits.empty() ? logit_chunk_rows() : N;
  for (std::int64_t r = 0; r < N; r += rows) {
    const std::int64_t n = std::min(rows, N - r);
    Allocation chunk;
    if (s.logits.empty()) {
      chunk = act("lm_head.logits", -1, {n, config_.vocab});
      linear(s.n_final.tensor().rows(r, n), weight(lm_head_), chunk);
    } else {
      chunk = std::move(s.logits);
    }
    const Tensor x = s.n_final.tensor().rows(r, n);
    backend_.cross_entropy_backward(chunk, targets_.tensor().rows(r, n), s.lse.tensor().rows(r, n), chunk,
                                    dlogits_scale);
    linear_backward_weight(chunk, x, gradient(*lm_head_), accumulating_ || r > 0);
    linear_backward_input(chunk, weight(lm_head_), dn.tensor().rows(r, n), 0.0f);
  }
  drop_lowp_copies({lm_head_});
  gradients_done({lm_head_});
  s.lse.reset();
  s.n_final.reset();
  head.next("ln_final");
  Allocation dx = wide("grad.residual", -1, {N, d});
  parameter_gradient(ln_final_, [&](const Tensor& dw) {
    backend_.rmsnorm_backward(dn, s.x_final, ln_final_->value, s.rstd_final, dx, dw);
  });
  gradients_done({ln_final_});
  hooked_head.reset();
  s.x_final.reset();
  s.rstd_final.reset();

  head.done();
  const double eps = 1e-5;
  Allocation dx_lowp;  // dx in the compute dtype where the layer after made it (norm_backward_add)
  for (int l = config_.layers - 1; l >= 0; --l) {
    ScopedRange r(ranges, RangeLevel::layer, "layer", l);
    HookedStretch hooked(*hooks_, layer_parameters(l, false), Pass::backward);
    const LayerParams& P = layer_params_[l];
    // This rank's heads and feed-forward width (layer_forward says why from the weights).
    const std::int64_t H = P.wq->spec.shape[0] / dk, f = P.w1->spec.shape[0];
    Layer& L = s.layers[l];
    // Full recompute: the layer's forward again from its input, keeping everything this time; its
    // output is the next layer's input, which the backward no longer needs.
    if (recompute_.at(l) == Recompute::full) layer_forward(l, std::move(L.x), L, Keep{}).reset();
    OpRanges op(ranges);
    op.next("w2");
    // x_out = h + w2·(silu(w1·n2) ∘ w3·n2), n2 = ln2(h); dx holds d x_out.
    Allocation dx_scratch = std::move(dx_lowp);
    const Tensor& dx_c = dx_scratch.empty() ? as_compute(dx, dx_scratch, "grad.residual.lowp", l) : dx_scratch;
    Allocation dgate = act("grad.ffn.gate", l, {N, f});
    linear_backward_input(dx_c, weight(P.w2), dgate, 0.0f);
    drop_lowp_copies({P.w2});
    if (L.gate.empty()) {  // selective: silu(a)∘b again
      L.gate = act("ffn.gate", l, {N, f});
      backend_.swiglu_forward(L.a, L.b, L.gate);
    }
    linear_backward_weight(dx_c, L.gate, gradient(*P.w2));
    gradients_done({P.w2});
    L.gate.reset();
    dx_scratch.reset();
    op.next("SwiGLU");
    Allocation da = act("grad.ffn.w1_out", l, {N, f}), db = act("grad.ffn.w3_out", l, {N, f});
    backend_.swiglu_backward(L.a, L.b, dgate, da, db);
    dgate.reset();
    L.a.reset();
    L.b.reset();
    op.next("w1, w3");
    dn = act("grad.ln2.out", l, {N, d});
    linear_backward_input(da, weight(P.w1), dn, 0.0f);
    linear_backward_input(db, weight(P.w3), dn, 1.0f);
    hooks_->partial_sum(dn, PartialSum::ffn_input_grad, l);
    drop_lowp_copies({P.w1, P.w3});
    if (L.n2.empty()) {  // selective: ln2's output again (its statistics are rewritten unchanged)
      L.n2 = act("ln2.out", l, {N, d});
      backend_.rmsnorm_forward(L.h, P.ln2->value, L.n2, L.rstd2, eps);
    }
    linear_backward_weight(da, L.n2, gradient(*P.w1));
    linear_backward_weight(db, L.n2, gradient(*P.w3));
    gradients_done({P.w1, P.w3});
    da.reset();
    db.reset();
    L.n2.reset();
    op.next("ln2 and residual");
    Allocation dh = wide("grad.attn.residual", l, {N, d});
    Allocation dh_scratch = norm_backward_add(P.ln2, dn, L.h, L.rstd2, dx, dh, "grad.attn.residual.lowp", l);
    gradients_done({P.ln2});
    dn.reset();
    dx.reset();
    L.h.reset();
    L.rstd2.reset();

    op.next("output projection");
    // h = x + wo·merge(attention(q, k, v)); dh holds d h.
    const Tensor& dh_c = dh_scratch.empty() ? as_compute(dh, dh_scratch, "grad.attn.residual.lowp", l) : dh_scratch;
    Allocation d_o = act("grad.attn.o", l, {N, H * dk});
    linear_backward_input(dh_c, weight(P.wo), d_o, 0.0f);
    drop_lowp_copies({P.wo});
    linear_backward_weight(dh_c, L.o, gradient(*P.wo));
    gradients_done({P.wo});
    dh_scratch.reset();
    // Flash's backward reads the output too: re-split from o (rather than saved twice) beside dO.
    Allocation o_heads = attention_ == AttentionKind::flash ? act("attn.o_heads", l, {B, H, T, dk}) : Allocation{};
    Allocation do_heads = act("grad.attn.o_heads", l, {B, H, T, dk});
    {
      const Tensor tokens[2] = {d_o.tensor().view({B, T, H, dk}), L.o.tensor().view({B, T, H, dk})};
      const Tensor heads[2] = {do_heads, o_heads};
      const double thetas[2] = {0.0, 0.0};
      const std::size_t moves = o_heads.empty() ? 1 : 2;
      backend_.split_heads_all({tokens, moves}, {heads, moves}, {thetas, moves});
    }
    L.o.reset();
    d_o.reset();
    op.next("attention");
    Allocation dq_heads = act("grad.attn.q", l, {B, H, T, dk}), dk_heads = act("grad.attn.k", l, {B, H, T, dk}),
               dv_heads = act("grad.attn.v", l, {B, H, T, dk});
    {
      const Shape flat{B * H, T, dk};
      const Tensor o_flat = o_heads.empty() ? Tensor{} : o_heads.tensor().view(flat);
      attention_backward(backend_, attention_call(l), L.q.tensor().view(flat), L.k.tensor().view(flat),
                         L.v.tensor().view(flat), o_flat, do_heads.tensor().view(flat), dq_heads.tensor().view(flat),
                         dk_heads.tensor().view(flat), dv_heads.tensor().view(flat), L.attn);
    }
    o_heads.reset();
    do_heads.reset();
    L.q.reset();
    L.k.reset();
    L.v.reset();

    op.next("q, k, v projections and RoPE");
    if (L.n1.empty()) {  // selective: ln1's output again
      L.n1 = act("ln1.out", l, {N, d});
      backend_.rmsnorm_forward(L.x, P.ln1->value, L.n1, L.rstd1, eps);
    }
    dn = act("grad.ln1.out", l, {N, d});
    Allocation dproj[3];
    {  // the three head merges in one move (one launch on CUDA), then each projection's products
      const Tensor dheads[3] = {dq_heads, dk_heads, dv_heads};
      Tensor tokens[3];
      for (int i = 0; i < 3; ++i) {
        dproj[i] = act("grad.attn.proj", l, {N, H * dk});
        tokens[i] = dproj[i].tensor().view({B, T, H, dk});
      }
      const double thetas[3] = {theta, theta, 0.0};
      backend_.merge_heads_all(dheads, tokens, thetas);
    }
    dq_heads.reset();
    dk_heads.reset();
    dv_heads.reset();
    Parameter* weights[3] = {P.wq, P.wk, P.wv};
    for (int i = 0; i < 3; ++i) {
      linear_backward_input(dproj[i], weight(weights[i]), dn, i == 0 ? 0.0f : 1.0f);
      drop_lowp_copies({weights[i]});
      linear_backward_weight(dproj[i], L.n1, gradient(*weights[i]));
      gradients_done({weights[i]});
      dproj[i].reset();
    }
    hooks_->partial_sum(dn, PartialSum::attention_input_grad, l);
    L.n1.reset();
    op.next("ln1 and residual");
    dx = wide("grad.residual", l, {N, d});
    // Layer 0's dx goes to the embedding's backward alone, which reads the master dtype.
    dx_lowp = norm_backward_add(P.ln1, dn, L.x, L.rstd1, dh, dx, l > 0 ? "grad.residual.lowp" : nullptr, l - 1);
    gradients_done({P.ln1});
    dn.reset();
    dh.reset();
    L.x.reset();
    L.rstd1.reset();
  }
  {
    HookedStretch hooked(*hooks_, embedding_stretch_, Pass::backward);
    ScopedRange r(ranges, RangeLevel::op, "embedding");
    if (grad_dtype_ == stats_dtype())
      backend_.embedding_backward(ids_, dx, gradient(*embedding_), accumulating_);  // adds in place: no scratch
    else
      parameter_gradient(embedding_, [&](const Tensor& dw) { backend_.embedding_backward(ids_, dx, dw, false); });
  }
  gradients_done({embedding_});
  accumulating_ = false;
  dx.reset();
  graph.end();
}

}  // namespace lmscope
