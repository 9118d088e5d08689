// The assignment's AdamW with global-norm clipping, and its cosine learning-rate schedule.
#pragma once

#include "lmscope/model/transformer.h"

namespace lmscope {

struct OptimizerConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  double clip = 1.0;  // global gradient-norm limit; 0 = off
  void validate() const;
};

struct LrSchedule {
  bool cosine = false;  // false: constant lr_max
  double lr_max = 1e-3, lr_min = 1e-4;
  std::int64_t warmup_iters = 0, cosine_iters = 0;
  // Learning rate at iteration `it` (from 0), MODEL.md's formula.
  double at(std::int64_t it) const;
  void validate() const;
};

class AdamW {
 public:
  AdamW(Transformer& model, const OptimizerConfig& config);
  // One update from the gradients now held by the model, at learning rate lr; frees them.
  void step(double lr);
  std::int64_t steps_taken() const { return t_; }
  // The moments of parameter i (the model's order), and the step count, as a checkpoint saves and
  // restores them.
  const Allocation& first_moment(std::size_t i) const { return m_.at(i); }
  const Allocation& second_moment(std::size_t i) const { return v_.at(i); }
  void set_steps_taken(std::int64_t t) { t_ = t; }
  // The global gradient norm of the last step, before clipping (reads the backend).
  double last_grad_norm();

 private:
  Transformer& model_;
  OptimizerConfig config_;
  std::vector<Allocation> m_, v_;
  Allocation grad_norm_;
  std::int64_t t_ = 0;
};

}  // namespace lmscope
