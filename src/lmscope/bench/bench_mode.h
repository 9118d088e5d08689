// What a bench cell runs (its --mode), apart from the runner, so readers of result files know the
// modes without the model.
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>
#include <string>

namespace lmscope {

// inference: a forward that keeps nothing for a backward (PyTorch's no_grad); forward: one that
// keeps what the backward would read, then drops it; forward_backward; train: both and AdamW.
enum class BenchMode { inference, forward, forward_backward, train };
inline constexpr BenchMode kBenchModes[] = {BenchMode::inference, BenchMode::forward, BenchMode::forward_backward,
                                            BenchMode::train};
static_assert(std::size(kBenchModes) == static_cast<std::size_t>(BenchMode::train) + 1, "every mode, train last");
const char* bench_mode_name(BenchMode m);
inline bool has_backward(BenchMode m) { return m == BenchMode::forward_backward || m == BenchMode::train; }
// The gradients' dtype a cell of mode m keeps: grad_dtype where it has a backward; a mode without one
// has no gradients, and says fp32 (the default) whatever was asked.
inline std::string cell_grad_dtype(BenchMode m, const std::string& grad_dtype) {
  return has_backward(m) ? grad_dtype : "fp32";
}
BenchMode parse_bench_mode(const std::string& s);                 // throws UserError
std::optional<BenchMode> bench_mode_named(const std::string& s);  // none for a name it does not know

}  // namespace lmscope
