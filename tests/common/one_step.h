// Training steps of a seeded model through the step driver, each taken whole or as micro-batches,
// with a recompute mode and a place for the weight copies: the last step's loss and gradients and
// every parameter after its AdamW, copied to the host. What the tests of the memory diet compare, on the CPU and on the
// GPU.
#pragma once

#include "tiny_model.h"

#include "lmscope/core/rng.h"
#include "lmscope/run/session.h"
#include "lmscope/run/step_driver.h"

#include <algorithm>
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
  RecomputePlan recompute;
  WeightCopies weight_copies = WeightCopies::kept;
  int steps = 1;  // on the same batch; a second step reads the copies the first one's AdamW wrote
  std::int64_t rows = 4, micro = 4, ctx = 32;  // rows sequences in micro-batches of micro
  double lr = 1e-3;
  std::size_t logit_chunk_bytes = Transformer::kLogitChunkBytes;
  bool fusion = false;            // Transformer::set_fusion
  DType grad_dtype = DType::f32;  // Transformer::set_grad_dtype
};

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

// The rows × ctx tokens of a step in micro-batches of `micro` rows, one after another, round and round.
class MicroBatchSlices : public BatchSource {
 public:
  MicroBatchSlices(std::vector<std::int32_t> ids, std::vector<std::int32_t> targets, std::int64_t micro_tokens)
      : ids_(std::move(ids)), targets_(std::move(targets)), micro_tokens_(micro_tokens) {}
  bool next(std::int32_t* ids, std::int32_t* targets) override {
    std::copy_n(ids_.begin() + at_, micro_tokens_, ids);
    std::copy_n(targets_.begin() + at_, micro_tokens_, targets);
    at_ = (at_ + micro_tokens_) % static_cast<std::int64_t>(ids_.size());
    return true;
  }

 private:
  std::vector<std::int32_t> ids_, targets_;
  std::int64_t micro_tokens_, at_ = 0;
};

// The precision whose compute dtype is `compute` (none: the masters', fp32).
// The model's forward and backward over `micro_batches` micro-batches, each the same batch of B
// sequences of T tokens drawn below `vocab` (seed 5): the sum of their losses, the gradients
// accumulated in the model. The hook tests run it with hooks and without.
inline double backward_over_micro_batches(Transformer& model, int micro_batches, std::int64_t B, std::int64_t T,
                                          std::int64_t vocab) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(B * T)), targets(ids.size());
  Rng rng(5);
  for (auto& t : ids) t = static_cast<std::int32_t>(rng.below(vocab));
  for (auto& t : targets) t = static_cast<std::int32_t>(rng.below(vocab));
  double loss = 0;
  for (int k = 0; k < micro_batches; ++k) {
    model.set_batch(B, T, ids.data(), targets.data());
    model.forward();
    model.backward({k, micro_batches});
    loss += model.read_loss();
  }
  return loss;
}

inline std::string precision_of(std::optional<DType> compute) {
  if (compute == DType::bf16) return "bf16";
  if (compute == DType::f16) return "fp16";
  return "fp32";
}

inline OneStep one_step(Backend& be, const OneStepSpec& s) {
  RunSpec spec;
  spec.model = s.model;
  spec.batch = s.micro;
  spec.ctx = s.ctx;
  spec.grad_accum = static_cast<int>(s.rows / s.micro);
  spec.precision = precision_of(s.compute);
  spec.attention = s.attention;
  spec.recompute = s.recompute;
  spec.weight_copies = s.weight_copies;
  spec.grad_dtype = s.grad_dtype;
  spec.graphs = false;
  spec.fusion = s.fusion;
  spec.seed = 6;
  spec.schedule.lr_max = s.lr;
  SessionOptions options;
  options.shared_backend = &be;
  Session session(spec, std::move(options));
  Transformer& model = session.model();
  model.set_logit_chunk_bytes(s.logit_chunk_bytes);
  const std::int64_t n = s.rows * s.ctx;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n)), targets(static_cast<std::size_t>(n));
  Rng rng(11);
  for (std::int64_t i = 0; i < n; ++i) {
    ids[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(s.model.vocab)));
    targets[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(s.model.vocab)));
  }
  MicroBatchSlices batches(std::move(ids), std::move(targets), s.micro * s.ctx);
  // What the step holds when its first forward ends, and its gradients before AdamW frees them.
  struct Reader : StepObserver {
    Backend& be;
    Transformer& model;
    OneStep out;
    Reader(Backend& b, Transformer& m) : be(b), model(m) {}
    void step_begin(std::int64_t) override { out = OneStep{}; }
    void phase_end(StepPhase p, int micro) override {
      if (p == StepPhase::forward && micro == 0) out.saved_bytes = be.allocator().current_bytes(MemKind::activation);
    }
    void phase_begin(StepPhase p, int) override {
      if (p == StepPhase::optimizer)
        for (Parameter& q : model.parameters()) out.grads.push_back(host_floats(be, q.grad));
    }
  } reader(be, model);
  StepDriver driver(session, batches, true);
  driver.add_observer(reader);
  for (int step = 0; step < s.steps; ++step) reader.out.loss = driver.step(step, step).loss;
  for (Parameter& p : model.parameters()) reader.out.params.push_back(host_floats(be, p.value));
  return reader.out;
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
