// The assignment's AdamW with global-norm clipping, and its cosine learning-rate schedule.
#pragma once

#include "lmscope/model/loss_scaler.h"
#include "lmscope/model/transformer.h"

#include <span>
#include <vector>

namespace lmscope {

struct OptimizerConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  double clip = 1.0;         // global gradient-norm limit; 0 = off
  LossScaling loss_scaling;  // used when the model computes in fp16
  // Skip every step whose gradients' norm is not finite, as loss scaling skips an overflow (train's):
  // the device leaves the weights and moments as they are, and the host reads the norm after the step.
  bool skip_nonfinite = false;
  void validate() const;
};

struct LrSchedule {
  bool cosine = false;  // false: constant lr_max
  double lr_max = 1e-3, lr_min = 1e-4;
  std::int64_t warmup_iters = 0, cosine_iters = 0;
  // Learning rate at iteration `it` (from 0), MODEL.md's formula.
  double at(std::int64_t it) const;
  void validate() const;
};

// Optimizer-state sharding (ZeRO-1 and ZeRO-2): this rank updates only its part of the parameters, and keeps
// AdamW's moments for that part alone. The part is pieces of parameters laid side by side in a shard
// of shard_elements(); the implementation (parallel/zero_sharding.h) moves gradients and parameters
// between the ranks.
struct ShardPiece {
  std::size_t param = 0;                // index in the model's parameters()
  std::int64_t offset = 0, length = 0;  // elements of that parameter (flattened)
  std::int64_t shard_offset = 0;        // where they sit in the shard
};
// The sums of this rank's shard of the gradients: one allocation per bucket of the exchange, each made
// as its reduce-scatter starts, so under ZeRO-2 they grow through the backward as the gradients they
// replace shrink (one allocation of them all would sit beside the backward's activations from its
// first bucket on).
class GradientShard {
 public:
  // A part of the shard beginning at `shard_offset` (in any order; parts do not overlap).
  void add(std::int64_t shard_offset, Allocation part);
  // Elements [shard_offset, shard_offset + length) of the shard: inside one part, as a ShardPiece is.
  Tensor rows(std::int64_t shard_offset, std::int64_t length) const;
  std::vector<Tensor> parts() const;
  bool empty() const { return parts_.empty(); }

 private:
  std::vector<std::int64_t> offsets_;
  std::vector<Allocation> parts_;
};

class OptimizerSharding {
 public:
  virtual ~OptimizerSharding() = default;
  virtual const std::vector<ShardPiece>& pieces() const = 0;
  virtual std::int64_t shard_elements() const = 0;
  // The sum over the ranks of this rank's part of the gradients (shard_elements() in the gradients'
  // dtype), every gradient freed (ZeRO-1 exchanges them here; ZeRO-2 began in the backward).
  virtual GradientShard summed_gradients() = 0;
  // norm [1] = the global norm from every rank's `partial` [1] (the norm of its part).
  virtual void combine_norms(const Tensor& partial, const Tensor& norm) = 0;
  // Every rank's updated part into every parameter, and the low-precision copies AdamW would write
  // (nothing where shards_parameters(): the next stretch to read a parameter gathers it).
  virtual void all_gather_parameters() = 0;
  // Parameter `param`'s values whole, in its shape, from every rank's pieces of it in `shard` (laid
  // out as pieces() say: AdamW's moments): a collective, every rank calling it for the same param.
  virtual Allocation whole(std::size_t param, const Tensor& shard) = 0;
  // The master values a piece's update writes: the parameter's own, or (ZeRO-3) this rank's shard of them.
  virtual Tensor master(const ShardPiece& piece) = 0;
  // ZeRO-3: the parameters live in the ranks' shards, whole only while a stretch of the step reads them.
  virtual bool shards_parameters() const { return false; }
  // Where shards_parameters(): parameter `param`'s values whole (a collective, as whole() is), and
  // this rank's pieces of them set from whole values.
  virtual std::vector<double> parameter_values(std::size_t /*param*/) { return {}; }
  virtual void set_parameter_values(std::size_t /*param*/, std::span<const double> /*values*/) {}
};

class AdamW {
 public:
  // sharding: ZeRO-1 or 2 (nullptr: every parameter updated here, the moments of all of them kept).
  AdamW(Transformer& model, const OptimizerConfig& config, OptimizerSharding* sharding = nullptr);
  // One update from the gradients now held by the model, at learning rate lr; frees them. With loss
  // scaling or OptimizerConfig::skip_nonfinite, the update is skipped when the gradients' norm is not
  // finite, and the host reads the norm afterwards (a wait for the device, as GradScaler's step
  // makes); returns whether the update was made (a skipped step does not count in steps_taken). One
  // device graph when the model's graphs are on.
  bool step(double lr);
  std::int64_t steps_taken() const { return t_; }
  // The gradients hold the sum of `ranks` ranks' gradients (data parallelism): the step divides
  // them by it, in the multiply that undoes a loss scale, and so does last_grad_norm.
  void set_gradient_sum_of(int ranks) { ranks_ = ranks; }
  bool sharded() const { return sharding_ != nullptr; }
  // The moments of parameter i (the model's order), and the step count, as a checkpoint saves and
  // restores them. moment_values: the whole tensor on the host; sharded, a collective (every
  // rank calls it, or join_moment_values, for the same i and moment in the same order) assembling
  // every rank's pieces. join_moment_values: a sharded rank's part in that, the values left on the
  // device (a rank that does not write the checkpoint; nothing unsharded). set_moment: from the
  // whole tensor's values (sharded, or split by tensor parallelism: this rank's pieces of them; a
  // collective to read where split, as where sharded).
  enum class Moment { first, second };
  std::vector<float> moment_values(std::size_t i, Moment which);
  void join_moment_values(std::size_t i, Moment which);
  void set_moment(std::size_t i, Moment which, std::span<const double> values);
  // Parameter i's values, as a checkpoint saves and restores them: whole on the host (under ZeRO-3, and
  // where tensor parallelism splits it, a collective, as moment_values is; join_parameter_values is a
  // rank's part that writes nothing), and
  // set from whole values (under ZeRO-3 this rank's pieces; elsewhere the master, its copy refreshed).
  std::vector<float> parameter_values(std::size_t i);
  void join_parameter_values(std::size_t i);
  void set_parameter_values(std::size_t i, std::span<const double> values);
  void set_steps_taken(std::int64_t t) { t_ = t; }
  // The global gradient norm of the last step, before clipping and without the loss scale (reads the
  // backend); not finite for a skipped step.
  double last_grad_norm();
  const LossScaler& loss_scaler() const { return scaler_; }
  double last_loss_scale() const { return last_scale_; }  // the scale the last step's gradients carried
  void restore_loss_scaler(const LossScaler::State& s);

 private:
  // After the updates: the loss scaler learns whether the step overflowed (reading the norm), and the
  // step count goes on unless it did.
  bool finish_step();
  // Moment `which` of parameter i as this rank holds it: its tensor, or (sharded) the shard.
  const Allocation& held_moment(std::size_t i, Moment which) const;
  // The updates of ZeRO: this rank's part from the summed gradients, then (ZeRO-1 and 2) every rank's
  // part into every parameter.
  void sharded_step(const AdamWArgs& args);
  // Tensor parallelism: the gradients' norm into grad_norm_, the split parameters' blocks summed over
  // the ranks (StepHooks::norm_over_ranks) beside the whole parameters' own.
  void split_norm(const std::vector<Tensor>& grads);
  Transformer& model_;
  OptimizerConfig config_;
  OptimizerSharding* sharding_ = nullptr;
  int ranks_ = 1;
  bool split_ = false;  // some parameter is split across ranks (tensor parallelism)
  std::vector<Allocation> m_, v_;
  Allocation norm_and_scalars_;
  Tensor grad_norm_, step_scalars_;  // [1] and [3] of it (AdamWArgs::step_scalars)
  std::int64_t t_ = 0;
  LossScaler scaler_;
  double last_scale_ = 1.0;  // the loss scale the last step's gradients carry
};

}  // namespace lmscope
