#include "lmscope/model/optimizer.h"

#include <cmath>
#include <numbers>

namespace lmscope {

void OptimizerConfig::validate() const {
  if (!(lr >= 0)) user_error("--lr must be non-negative, got {}", lr);
  if (!(beta1 >= 0 && beta1 < 1)) user_error("--beta1 must lie in [0, 1), got {}", beta1);
  if (!(beta2 >= 0 && beta2 < 1)) user_error("--beta2 must lie in [0, 1), got {}", beta2);
  if (!(eps > 0)) user_error("--eps must be positive, got {}", eps);
  if (!(weight_decay >= 0)) user_error("--weight-decay must be non-negative, got {}", weight_decay);
  if (!(clip >= 0)) user_error("--clip must be non-negative (0 turns clipping off), got {}", clip);
  loss_scaling.validate();
}

void LrSchedule::validate() const {
  if (!(lr_max >= 0)) user_error("--lr must be non-negative, got {}", lr_max);
  if (!cosine) return;
  if (!(lr_min >= 0)) user_error("--min-lr must be non-negative, got {}", lr_min);
  if (warmup_iters < 0) user_error("--warmup-iters must be non-negative, got {}", warmup_iters);
  if (cosine_iters < warmup_iters)
    user_error("--cosine-iters ({}) must be at least --warmup-iters ({})", cosine_iters, warmup_iters);
}

double LrSchedule::at(std::int64_t it) const {
  if (!cosine) return lr_max;
  if (it < warmup_iters) return lr_max * static_cast<double>(it) / static_cast<double>(warmup_iters);
  if (it > cosine_iters || cosine_iters == warmup_iters) return lr_min;
  const double progress = static_cast<double>(it - warmup_iters) / static_cast<double>(cosine_iters - warmup_iters);
  return lr_min + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (lr_max - lr_min);
}

AdamW::AdamW(Transformer& model, const OptimizerConfig& config)
    : model_(model),
      config_(config),
      scaler_(config.loss_scaling, config.loss_scaling.force || model.compute_dtype() == DType::f16) {
  config_.validate();
  model_.set_loss_scale(scaler_.scale());
  Backend& be = model_.backend();
  for (Parameter& p : model_.parameters()) {
    m_.push_back(be.allocator().allocate(p.spec.shape, model_.dtype(),
                                         {MemKind::optimizer_state, "adamw.m." + p.spec.name, p.spec.layer}));
    v_.push_back(be.allocator().allocate(p.spec.shape, model_.dtype(),
                                         {MemKind::optimizer_state, "adamw.v." + p.spec.name, p.spec.layer}));
    be.fill(m_.back(), 0.0);
    be.fill(v_.back(), 0.0);
  }
  grad_norm_ = be.allocator().allocate({1}, model_.dtype(), {MemKind::workspace, "adamw.grad_norm", -1});
}

bool AdamW::step(double lr) {
  Backend& be = model_.backend();
  be.allocator().set_phase(Phase::optimizer);
  std::vector<Tensor> grads;
  for (Parameter& p : model_.parameters()) {
    LMSCOPE_CHECK(!p.grad.empty(), "optimizer step before backward");
    grads.push_back(p.grad);
  }
  be.global_norm(grads, grad_norm_);
  last_scale_ = scaler_.scale();
  if (scaler_.on()) {
    const bool apply = scaler_.update(std::isfinite(read_scalar(be, grad_norm_)));
    model_.set_loss_scale(scaler_.scale());
    if (!apply) {  // nothing changes but the scale; the next forward casts the weight copies anew
      for (Parameter& p : model_.parameters()) p.grad.reset();
      return false;
    }
  }
  ++t_;
  AdamWArgs args{lr, config_.beta1, config_.beta2,    config_.eps, config_.weight_decay,
                 t_, config_.clip,  1.0 / last_scale_};
  // Each gradient goes once read; the low-precision copy AdamW writes (when the copies are kept)
  // takes its place, so the copies never sit beside every gradient.
  auto& params = model_.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Allocation& copy = model_.lowp_copy(params[i]);
    be.adamw(params[i].value, params[i].grad, m_[i], v_[i], args, grad_norm_, copy);
    params[i].grad.reset();
  }
  return true;
}

double AdamW::last_grad_norm() { return read_scalar(model_.backend(), grad_norm_) / last_scale_; }

void AdamW::restore_loss_scaler(const LossScaler::State& s) {
  scaler_.restore(s);
  model_.set_loss_scale(scaler_.scale());
}

}  // namespace lmscope
