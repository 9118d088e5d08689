#include "lmscope/run/step_mode.h"

#include "lmscope/core/error.h"

namespace lmscope {

const char* step_mode_name(StepMode m) {
  switch (m) {
    case StepMode::inference:
      return "inference";
    case StepMode::forward:
      return "forward";
    case StepMode::forward_backward:
      return "forward-backward";
    case StepMode::train:
      return "train";
  }
  return "?";
}

std::optional<StepMode> step_mode_named(const std::string& s) {
  for (StepMode m : kStepModes)
    if (s == step_mode_name(m)) return m;
  return std::nullopt;
}

StepMode parse_step_mode(const std::string& s) {
  if (const std::optional<StepMode> m = step_mode_named(s)) return *m;
  user_error("unknown --mode '{}' (use inference, forward, forward-backward or train)", s);
}

}  // namespace lmscope
