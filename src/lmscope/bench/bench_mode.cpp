#include "lmscope/bench/bench_mode.h"

#include "lmscope/core/error.h"

namespace lmscope {

const char* bench_mode_name(BenchMode m) {
  switch (m) {
    case BenchMode::inference:
      return "inference";
    case BenchMode::forward:
      return "forward";
    case BenchMode::forward_backward:
      return "forward-backward";
    case BenchMode::train:
      return "train";
  }
  return "?";
}

std::optional<BenchMode> bench_mode_named(const std::string& s) {
  for (BenchMode m : kBenchModes)
    if (s == bench_mode_name(m)) return m;
  return std::nullopt;
}

BenchMode parse_bench_mode(const std::string& s) {
  if (const std::optional<BenchMode> m = bench_mode_named(s)) return *m;
  user_error("unknown --mode '{}' (use inference, forward, forward-backward or train)", s);
}

}  // namespace lmscope
