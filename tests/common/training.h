// Losses of 20 training steps on one fixed batch, the model seeded alike on every backend: what the
// tests compare between backends, precisions and attention forms.
#pragma once

#include "lmscope/model/optimizer.h"
#include "lmscope/model/transformer.h"

#include <optional>
#include <vector>

namespace lmscope::test {

inline std::vector<double> twenty_step_losses(Backend& be, const ModelConfig& c, std::optional<DType> compute,
                                              std::int64_t B, std::int64_t T, const std::vector<std::int32_t>& x,
                                              const std::vector<std::int32_t>& y,
                                              AttentionKind attention = AttentionKind::flash) {
  Transformer model(c, be, DType::f32, compute, attention);
  model.init_parameters(11);
  AdamW opt(model, {.lr = 3e-3, .clip = 1.0, .loss_scaling = {}});
  model.set_batch(B, T, x.data(), y.data());
  std::vector<double> out;
  for (int i = 0; i < 20; ++i) {
    model.forward();
    out.push_back(model.read_loss());
    model.backward();
    opt.step(3e-3);
  }
  return out;
}

}  // namespace lmscope::test
