#include "lmscope/model/optimizer.h"

#include <algorithm>

#include "lmscope/core/hash.h"

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
  // Checked under the constant schedule too, which ignores them: --min-lr -1 there ran and said nothing.
  if (!(lr_min >= 0)) user_error("--min-lr must be non-negative, got {}", lr_min);
  if (warmup_iters < 0) user_error("--warmup-iters must be non-negative, got {}", warmup_iters);
  if (cosine_iters < 0) user_error("--cosine-iters must be non-negative, got {}", cosine_iters);
  if (!cosine) return;
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

AdamW::AdamW(Transformer& model, const OptimizerConfig& config, OptimizerSharding* sharding)
    : model_(model),
      config_(config),
      sharding_(sharding),
      scaler_(config.loss_scaling, config.loss_scaling.force || model.compute_dtype() == DType::f16) {
  config_.validate();
  model_.set_loss_scale(scaler_.scale());
  for (std::size_t i = 0; i < model_.parameters().size(); ++i) split_ = split_ || model_.split(i);
  LMSCOPE_CHECK(!split_ || !sharding_, "ZeRO over parameters split across ranks");
  Backend& be = model_.backend();
  if (sharding_) {  // the moments of this rank's part only, side by side as the shard lays it out
    const Shape shard{sharding_->shard_elements()};
    m_.push_back(be.allocator().allocate(shard, model_.dtype(), {MemKind::optimizer_state, "adamw.m.shard", -1}));
    v_.push_back(be.allocator().allocate(shard, model_.dtype(), {MemKind::optimizer_state, "adamw.v.shard", -1}));
    be.fill(m_.back(), 0.0);
    be.fill(v_.back(), 0.0);
  }
  for (Parameter& p : model_.parameters()) {
    if (sharding_) break;
    m_.push_back(be.allocator().allocate(p.spec.shape, model_.dtype(),
                                         {MemKind::optimizer_state, "adamw.m." + p.spec.name, p.spec.layer}));
    v_.push_back(be.allocator().allocate(p.spec.shape, model_.dtype(),
                                         {MemKind::optimizer_state, "adamw.v." + p.spec.name, p.spec.layer}));
    be.fill(m_.back(), 0.0);
    be.fill(v_.back(), 0.0);
  }
  // The norm and, behind it in the same 256 bytes, the step's scalars (AdamWArgs::step_scalars).
  norm_and_scalars_ = be.allocator().allocate({4}, model_.stats_dtype(), {MemKind::workspace, "adamw.grad_norm", -1});
  grad_norm_ = norm_and_scalars_.tensor().rows(0, 1);
  step_scalars_ = norm_and_scalars_.tensor().rows(1, 3);
}

bool AdamW::step(double lr) {
  Backend& be = model_.backend();
  be.allocator().set_phase(Phase::optimizer);
  std::vector<Tensor> grads;  // unsharded: every gradient (sharded, they have gone into the shard's sums)
  if (!sharding_)
    for (Parameter& p : model_.parameters()) {
      LMSCOPE_CHECK(!p.grad.empty(), "optimizer step before backward");
      grads.push_back(p.grad);
    }
  last_scale_ = scaler_.scale();
  const double divisor = last_scale_ * static_cast<double>(ranks_);
  const AdamWArgs args{.lr = lr,
                       .beta1 = config_.beta1,
                       .beta2 = config_.beta2,
                       .eps = config_.eps,
                       .weight_decay = config_.weight_decay,
                       .step = t_ + 1,
                       .max_norm = config_.clip,
                       .grad_scale = 1.0 / divisor,
                       .step_scalars = step_scalars_,
                       .skip_nonfinite = scaler_.on() || config_.skip_nonfinite};
  // The step's rate goes to the device before the step's ops, so a recorded step replays at it.
  const std::array<double, 3> scalars = adamw_step_scalars(args);
  for (std::int64_t i = 0; i < 3; ++i) be.fill(step_scalars_.rows(i, 1), scalars[i]);
  {
    GraphScope graph(
        be, model_.graphs(),
        hash_mix(hash_mix(model_.graph_key("optimizer"), config_.clip), reinterpret_cast<std::uintptr_t>(this)));
    auto& params = model_.parameters();
    if (sharding_) {
      sharded_step(args);
      graph.end();
      return finish_step();
    }
    // Each gradient goes once read; the low-precision copies AdamW writes (when the copies are kept)
    // take the memory the gradients left (one by one, or Backend::adamw_all's groups), so no more than
    // one copy ever sits beside every gradient (resident copies sit beside them all along and are
    // written in place). Where steps are skipped (loss scaling, skip_nonfinite), one whose norm is not
    // finite changes nothing but the copies (written from the unchanged masters); the device
    // decides, so the host need not wait for the norm first.
    if (split_) {  // tensor parallelism: the norm over the ranks' blocks, then each update
      split_norm(grads);
      for (std::size_t i = 0; i < params.size(); ++i) {
        be.adamw(params[i].value, params[i].grad, m_[i], v_[i], args, grad_norm_, model_.lowp_copy(params[i]));
        params[i].grad.reset();
      }
    } else if (model_.fusion()) {  // the norm and every update in a few launches
      std::vector<Tensor> values, ms, vs;
      for (std::size_t i = 0; i < params.size(); ++i) {
        values.push_back(params[i].value);
        ms.push_back(m_[i]);
        vs.push_back(v_[i]);
      }
      be.adamw_all(
          values, grads, ms, vs, args, grad_norm_, [&](std::size_t i) { return model_.lowp_copy(params[i]).tensor(); },
          [&](std::size_t i) { params[i].grad.reset(); });
    } else {
      be.global_norm(grads, grad_norm_);
      for (std::size_t i = 0; i < params.size(); ++i) {
        be.adamw(params[i].value, params[i].grad, m_[i], v_[i], args, grad_norm_, model_.lowp_copy(params[i]));
        params[i].grad.reset();
      }
    }
    graph.end();
  }
  return finish_step();
}

void AdamW::split_norm(const std::vector<Tensor>& grads) {
  Backend& be = model_.backend();
  std::vector<Tensor> blocks, wholes;
  for (std::size_t i = 0; i < grads.size(); ++i) (model_.split(i) ? blocks : wholes).push_back(grads[i]);
  Allocation norms = be.allocator().allocate({2}, model_.stats_dtype(), {MemKind::workspace, "tp.norm_parts", -1});
  const Tensor split = norms.tensor().rows(0, 1), whole = norms.tensor().rows(1, 1);
  be.global_norm(blocks, split);
  model_.hooks().norm_over_ranks(split);
  be.global_norm(wholes, whole);
  const Tensor both = norms.tensor();
  be.global_norm(std::span(&both, 1), grad_norm_);  // √(split² + whole²)
}

void AdamW::sharded_step(const AdamWArgs& args) {
  Backend& be = model_.backend();
  Allocator& mem = be.allocator();
  {
    const GradientShard grad = sharding_->summed_gradients();
    {
      Allocation partial = mem.allocate({1}, model_.stats_dtype(), {MemKind::workspace, "zero.partial_norm", -1});
      be.global_norm(grad.parts(), partial);
      sharding_->combine_norms(partial, grad_norm_);
    }
    for (const ShardPiece& piece : sharding_->pieces()) {
      auto part = [&](const Tensor& t, std::int64_t at) { return t.rows(at, piece.length); };
      be.adamw(sharding_->master(piece), grad.rows(piece.shard_offset, piece.length), part(m_[0], piece.shard_offset),
               part(v_[0], piece.shard_offset), args, grad_norm_, Tensor{});
    }
  }  // the gradients' sums freed before the parameters are gathered
  sharding_->all_gather_parameters();
}

void GradientShard::add(std::int64_t shard_offset, Allocation part) {
  // Kept in the shard's order (buckets need not become final in it).
  const auto after = std::upper_bound(offsets_.begin(), offsets_.end(), shard_offset);
  const std::size_t k = static_cast<std::size_t>(after - offsets_.begin());
  LMSCOPE_CHECK(k == 0 || offsets_[k - 1] + parts_[k - 1].tensor().numel() <= shard_offset,
                "gradient shard parts at {} and {} overlap", offsets_[k - 1], shard_offset);
  LMSCOPE_CHECK(k == offsets_.size() || shard_offset + part.tensor().numel() <= offsets_[k],
                "gradient shard parts at {} and {} overlap", shard_offset, offsets_[k]);
  offsets_.insert(after, shard_offset);
  parts_.insert(parts_.begin() + static_cast<std::ptrdiff_t>(k), std::move(part));
}

Tensor GradientShard::rows(std::int64_t shard_offset, std::int64_t length) const {
  const auto after = std::upper_bound(offsets_.begin(), offsets_.end(), shard_offset);
  LMSCOPE_CHECK(after != offsets_.begin(), "shard offset {} before the first part", shard_offset);
  const std::size_t k = static_cast<std::size_t>(after - offsets_.begin()) - 1;
  const Tensor part = parts_[k].tensor();
  LMSCOPE_CHECK(length >= 0 && shard_offset - offsets_[k] + length <= part.numel(),
                "shard elements {}-{} cross the end of the part at {}", shard_offset, shard_offset + length,
                offsets_[k]);
  return part.rows(shard_offset - offsets_[k], length);
}

std::vector<Tensor> GradientShard::parts() const {
  std::vector<Tensor> all;
  for (const Allocation& a : parts_) all.push_back(a.tensor());
  return all;
}

const Allocation& AdamW::held_moment(std::size_t i, Moment which) const {
  const std::vector<Allocation>& all = which == Moment::first ? m_ : v_;
  return all.at(sharding_ ? 0 : i);  // sharded: the one shard of every piece
}

std::vector<float> AdamW::moment_values(std::size_t i, Moment which) {
  const std::vector<double> v = sharding_ ? download(model_.backend(), sharding_->whole(i, held_moment(i, which)))
                                          : model_.whole_values(i, held_moment(i, which));
  return std::vector<float>(v.begin(), v.end());
}

std::vector<float> AdamW::parameter_values(std::size_t i) {
  const std::vector<double> v =
      sharding_ && sharding_->shards_parameters() ? sharding_->parameter_values(i) : model_.whole_values(i);
  return std::vector<float>(v.begin(), v.end());
}

void AdamW::join_parameter_values(std::size_t i) {
  if (sharding_ && sharding_->shards_parameters()) sharding_->parameter_values(i);
  if (model_.split(i)) model_.whole_values(i);
}

void AdamW::set_parameter_values(std::size_t i, std::span<const double> values) {
  if (sharding_ && sharding_->shards_parameters()) {
    sharding_->set_parameter_values(i, values);
    return;
  }
  Parameter& p = model_.parameters().at(i);
  upload(model_.backend(), p.value, model_.local_values(i, values));  // this rank's block where split
  if (Allocation& copy = model_.lowp_copy(p); !copy.empty()) model_.backend().cast(p.value, copy);
}

void AdamW::join_moment_values(std::size_t i, Moment which) {
  if (sharding_) sharding_->whole(i, held_moment(i, which));
  if (model_.split(i)) model_.whole_values(i, held_moment(i, which));
}

void AdamW::set_moment(std::size_t i, Moment which, std::span<const double> values) {
  const Allocation& own = held_moment(i, which);
  if (!sharding_) {
    upload(model_.backend(), own, model_.local_values(i, values));  // this rank's block where split
    return;
  }
  for (const ShardPiece& piece : sharding_->pieces())
    if (piece.param == i)
      upload(model_.backend(), own.tensor().rows(piece.shard_offset, piece.length),
             values.subspan(static_cast<std::size_t>(piece.offset), static_cast<std::size_t>(piece.length)));
}

bool AdamW::finish_step() {
  if (scaler_.on()) {
    const bool applied = scaler_.update(std::isfinite(read_scalar(model_.backend(), grad_norm_)));
    model_.set_loss_scale(scaler_.scale());
    if (!applied) return false;
  } else if (config_.skip_nonfinite && !std::isfinite(read_scalar(model_.backend(), grad_norm_))) {
    return false;  // the device left everything as it was
  }
  ++t_;
  return true;
}

double AdamW::last_grad_norm() {
  return read_scalar(model_.backend(), grad_norm_) / (last_scale_ * static_cast<double>(ranks_));
}

void AdamW::restore_loss_scaler(const LossScaler::State& s) {
  scaler_.restore(s);
  model_.set_loss_scale(scaler_.scale());
}

}  // namespace lmscope
