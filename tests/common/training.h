// Losses of 20 training steps on one fixed batch, the model seeded alike on every backend: what the
// tests compare between backends, precisions and attention forms.
#pragma once

#include "one_step.h"

#include <optional>
#include <vector>

namespace lmscope::test {

inline std::vector<double> twenty_step_losses(Backend& be, const ModelConfig& c, std::optional<DType> compute,
                                              std::int64_t B, std::int64_t T, const std::vector<std::int32_t>& x,
                                              const std::vector<std::int32_t>& y,
                                              AttentionKind attention = AttentionKind::flash) {
  RunSpec spec;
  spec.model = c;
  spec.batch = B;
  spec.ctx = T;
  spec.precision = precision_of(compute);
  spec.attention = attention;
  spec.graphs = false;
  spec.fusion = false;
  spec.seed = 11;
  spec.optimizer.lr = 3e-3;
  spec.schedule.lr_max = 3e-3;
  SessionOptions options;
  options.shared_backend = &be;
  Session session(spec, std::move(options));
  MicroBatchSlices batches(x, y, B * T);
  StepDriver driver(session, batches, true);
  std::vector<double> out;
  for (int i = 0; i < 20; ++i) out.push_back(driver.step(i, i).loss);
  return out;
}

}  // namespace lmscope::test
