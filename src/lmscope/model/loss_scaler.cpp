#include "lmscope/model/loss_scaler.h"

#include "lmscope/core/error.h"

#include <cmath>

namespace lmscope {

void LossScaling::validate() const {
  // Powers of two scale and unscale exactly, so the scale changes nothing but the range.
  int exp = 0;
  if (!(initial > 0) || std::frexp(initial, &exp) != 0.5)
    user_error("--loss-scale must be a positive power of two, got {}", initial);
  if (interval <= 0) user_error("--loss-scale-interval must be positive, got {}", interval);
}

LossScaler::LossScaler(const LossScaling& config, bool on) : config_(config), on_(on) {
  config_.validate();
  state_.scale = on_ ? config_.initial : 1.0;
}

bool LossScaler::update(bool finite) {
  if (!on_) return true;
  if (!finite) {
    state_.scale *= config_.backoff;
    state_.good_steps = 0;
    ++state_.skipped;
    return false;
  }
  if (++state_.good_steps == config_.interval) {
    state_.scale *= config_.growth;
    state_.good_steps = 0;
  }
  return true;
}

}  // namespace lmscope
