// What a step runs (--mode), apart from the runner, so readers of result files know the
// modes without the model.
#pragma once

#include "lmscope/core/tensor.h"

#include <cstddef>
#include <iterator>
#include <optional>
#include <string>

namespace lmscope {

// inference: a forward that keeps nothing for a backward (PyTorch's no_grad); forward: one that
// keeps what the backward would read, then drops it; forward_backward; train: both and AdamW.
enum class StepMode { inference, forward, forward_backward, train };
inline constexpr StepMode kStepModes[] = {StepMode::inference, StepMode::forward, StepMode::forward_backward,
                                          StepMode::train};
static_assert(std::size(kStepModes) == static_cast<std::size_t>(StepMode::train) + 1, "every mode, train last");
const char* step_mode_name(StepMode m);
inline bool has_backward(StepMode m) { return m == StepMode::forward_backward || m == StepMode::train; }
// The gradients' dtype a cell of mode m keeps: grad_dtype where it has a backward; a mode without one
// has no gradients, and says fp32 (the default) whatever was asked.
inline DType cell_grad_dtype(StepMode m, DType grad_dtype) { return has_backward(m) ? grad_dtype : DType::f32; }
StepMode parse_step_mode(const std::string& s);                 // throws UserError
std::optional<StepMode> step_mode_named(const std::string& s);  // none for a name it does not know

}  // namespace lmscope
