// Training steps of a seeded model, each taken whole or as micro-batches, with a recompute mode and
// a place for the weight copies: the last step's loss and gradients and every parameter after its
// AdamW, copied to the host. What the tests of the memory diet compare, on the CPU and on the GPU.
#pragma once

#include "lmscope/core/rng.h"
#include "lmscope/model/optimizer.h"
#include "lmscope/model/transformer.h"

#include <cmath>
#include <optional>
#include <vector>

namespace lmscope::test {

struct OneStep {
  double loss = 0;  // the mean over the micro-batches
  std::vector<std::vector<float>> grads, params;
  std::size_t saved_bytes = 0;  // activations held when the first forward ends
};

struct OneStepSpec {
  ModelConfig model;
  std::optional<DType> compute;
  AttentionKind attention = AttentionKind::flash;
  Recompute recompute = Recompute::none;
  WeightCopies weight_copies = WeightCopies::kept;
  int steps = 1;  // on the same batch; a second step reads the copies the first one's AdamW wrote
  std::int64_t rows = 4, micro = 4, ctx = 32;  // rows sequences in micro-batches of micro
  double lr = 1e-3;
  std::size_t logit_chunk_bytes = Transformer::kLogitChunkBytes;
  bool fusion = false;            // Transformer::set_fusion
  DType grad_dtype = DType::f32;  // Transformer::set_grad_dtype
};

// Three layers of width 32 over a vocabulary of 37: a step of it takes the CPU milliseconds.
inline ModelConfig tiny_model() {
  ModelConfig c;
  c.name = "tiny";
  c.vocab = 37;
  c.d_model = 32;
  c.d_ff = 48;
  c.layers = 3;
  c.heads = 2;
  return c;
}

// t's values as floats (a tensor of another dtype cast to f32 on the backend first).
inline std::vector<float> host_floats(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  if (t.dtype == DType::f32) {
    be.copy_to_host(v.data(), t);
    return v;
  }
  Allocation f = be.allocator().allocate(t.shape, DType::f32, {MemKind::workspace, "test.host_floats", -1});
  be.cast(t, f);
  be.copy_to_host(v.data(), f);
  return v;
}

inline OneStep one_step(Backend& be, const OneStepSpec& s) {
  Transformer model(s.model, be, DType::f32, s.compute, s.attention);
  model.set_recompute(s.recompute);
  model.set_weight_copies(s.weight_copies);
  model.set_logit_chunk_bytes(s.logit_chunk_bytes);
  model.set_fusion(s.fusion);
  model.set_grad_dtype(s.grad_dtype);
  model.init_parameters(6);
  const std::int64_t n = s.rows * s.ctx;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n)), targets(static_cast<std::size_t>(n));
  Rng rng(11);
  for (std::int64_t i = 0; i < n; ++i) {
    ids[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(s.model.vocab)));
    targets[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(s.model.vocab)));
  }
  AdamW opt(model, OptimizerConfig{});
  OneStep out;
  const int k = static_cast<int>(s.rows / s.micro);
  for (int step = 0; step < s.steps; ++step) {
    out = OneStep{};
    for (int i = 0; i < k; ++i) {
      const std::int64_t at = i * s.micro * s.ctx;
      model.set_batch(s.micro, s.ctx, ids.data() + at, targets.data() + at);
      model.forward();
      if (i == 0) out.saved_bytes = be.allocator().current_bytes(MemKind::activation);
      model.backward({i, k});
      out.loss += model.read_loss() / k;
    }
    for (Parameter& p : model.parameters()) out.grads.push_back(host_floats(be, p.grad));
    opt.step(s.lr);
  }
  for (Parameter& p : model.parameters()) out.params.push_back(host_floats(be, p.value));
  return out;
}

// The largest over tensors of ‖a − b‖ / ‖b‖.
inline double largest_relative_difference(const std::vector<std::vector<float>>& a,
                                          const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double diff = 0, norm = 0;
    for (std::size_t j = 0; j < a[i].size(); ++j) {
      diff += std::pow(static_cast<double>(a[i][j]) - b[i][j], 2);
      norm += std::pow(static_cast<double>(b[i][j]), 2);
    }
    worst = std::max(worst, norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff));
  }
  return worst;
}

}  // namespace lmscope::test
