// The bench cell the GPU tests run when they need a whole step and not its speed: the small preset
// cut to 2 layers, batch 2, ctx 64, on CUDA.
#pragma once

#include "lmscope/bench/runner.h"

namespace lmscope::test {

inline BenchSpec small_cuda_cell(const char* precision, int warmup, int steps) {
  BenchSpec spec;
  spec.model = preset("small");
  spec.model.layers = 2;
  spec.device = "cuda";
  spec.precision = precision;
  spec.batch = 2;
  spec.ctx = 64;
  spec.warmup = warmup;
  spec.steps = steps;
  return spec;
}

}  // namespace lmscope::test
