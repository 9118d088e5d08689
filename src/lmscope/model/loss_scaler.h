// Dynamic loss scaling for fp16 training, as torch.amp.GradScaler does it: the backward starts from
// the loss's gradient times a scale S so that small gradients do not flush to zero in fp16; a step
// whose gradients overflowed (their norm is not finite) is skipped and S halves; after `interval`
// steps in a row without overflow S doubles. bf16 has fp32's range and needs none of this.
#pragma once

#include <cstdint>

namespace lmscope {

// AdamW scales the loss whenever the model computes in fp16.
struct LossScaling {
  bool force = false;            // scale under other precisions too (tests: powers of two change nothing)
  double initial = 65536.0;      // 2^16, GradScaler's init_scale
  double growth = 2.0;           // GradScaler's growth_factor
  double backoff = 0.5;          // GradScaler's backoff_factor
  std::int64_t interval = 2000;  // GradScaler's growth_interval
  void validate() const;         // UserError naming the flag (--loss-scale, --loss-scale-interval)
};

class LossScaler {
 public:
  struct State {
    double scale = 1.0;
    std::int64_t good_steps = 0;  // since the last overflow or growth
    std::int64_t skipped = 0;     // steps skipped so far in the run
  };
  LossScaler(const LossScaling& config, bool on);
  bool on() const { return on_; }
  double scale() const { return state_.scale; }
  std::int64_t skipped() const { return state_.skipped; }
  // After a step's gradients: whether they were all finite. Returns whether to apply the step, and
  // sets the scale for the next one.
  bool update(bool finite);
  const State& state() const { return state_; }
  void restore(const State& s) { state_ = s; }

 private:
  LossScaling config_;
  bool on_;
  State state_;
};

}  // namespace lmscope
