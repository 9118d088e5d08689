// Where a parallelism meets the model's step. The model calls these at fixed points of its forward and
// backward, whatever runs; the default does nothing, so a run of one process is the model alone. Data
// parallelism (parallel/data_parallel_run.h) hears each gradient become final and lays the gradients out
// for its exchange; what shards the weights (ZeRO-3) gathers a stretch's parameters at acquire and frees
// them at release; what splits the projections (tensor parallelism) gives each parameter its local
// shape and sums the partial products (docs/design.md, "Parallelisms through StepHooks").
#pragma once

#include "lmscope/core/tensor.h"
#include "lmscope/model/config.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace lmscope {

struct Parameter;

enum class Pass { forward, backward };

// Each gradient as part `part` of a block of `parts` (the all-gather exchange gathers the world's
// parts into one another's blocks in place); 1, 0: a gradient is its own block.
struct GradientParts {
  int parts = 1, part = 0;
};

// The model's row-parallel products, whose outputs tensor parallelism sums over its ranks: the
// attention's output projection and the feed-forward's w2 (forward), and the inputs' gradients of the
// column-parallel q, k, v and w1, w3 (backward).
enum class PartialSum { attention_output, ffn_output, attention_input_grad, ffn_input_grad };

class StepHooks {
 public:
  virtual ~StepHooks() = default;
  // The shape parameter `spec` has on this rank; asked as the model allocates its parameters, so hooks
  // that change shapes are given to the model's constructor.
  virtual Shape local_shape(const ParameterSpec& spec) const { return spec.shape; }
  // Where this rank's block of parameter `spec` (its whole shape) starts: the first row and column of
  // the whole [out, in] matrix (0 for the first of a vector); its extent is local_shape. Initial and
  // loaded values are the whole tensor's, cut to the block.
  struct Block {
    std::int64_t row = 0, col = 0;
  };
  virtual Block local_block(const ParameterSpec& /*spec*/) const { return {}; }
  // A norm over the gradients of the parameters split across the ranks (their blocks, as
  // local_shape makes them): `norm` [1] holds this rank's; after the call, the norm over every
  // rank's blocks (AdamW's clipping). Nothing splits them by default.
  virtual void norm_over_ranks(const Tensor& /*norm*/) {}
  // A split parameter's whole values (`whole` has its whole shape) from every rank's block, `local`
  // being this rank's: a collective, every rank calling it for the same parameter.
  virtual std::vector<double> whole_values(const ParameterSpec& /*whole*/, const Tensor& /*local*/) { return {}; }
  // Before the first read of these parameters in a stretch of a pass (the embedding; one layer, with
  // the norm after it that a fused residual add makes; the head) and after the last: a sharded
  // parallelism gathers their values into Parameter::value at acquire and frees them at release.
  virtual void acquire(std::span<Parameter* const> /*params*/, Pass /*pass*/) {}
  virtual void release(std::span<Parameter* const> /*params*/, Pass /*pass*/) {}
  // t holds this rank's partial sum of a row-parallel product; after the call, the sum over the ranks.
  virtual void partial_sum(const Tensor& /*t*/, PartialSum /*where*/, int /*layer*/) {}
  // In the step's last micro-batch, as each parameter's gradient becomes final (its index in
  // Transformer::parameters()), in the order the backward finishes them.
  virtual void gradient_ready(std::size_t /*param*/) {}
  virtual GradientParts gradient_parts() const { return {}; }
  // Whether the model's phases may run as recorded device graphs (collectives are not recorded).
  virtual bool allows_graphs() const { return true; }
};

}  // namespace lmscope
