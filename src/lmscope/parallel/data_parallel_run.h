// What one rank of a data-parallel run holds, for the commands that step a model (train, bench, the
// dry run of memory): its place in the world, the communicator, and the gradients' exchange
// (GradientSync, or ZeRO's sharding for the optimizer), wired into the model and AdamW.
#pragma once

#include "lmscope/parallel/data_parallel.h"
#include "lmscope/parallel/zero_sharding.h"

#include <memory>

namespace lmscope::parallel {

// Before a rank's backend is made: on CUDA in a world of several, the GPU of its local rank.
void use_rank_gpu(const World& world, const std::string& device);

// A rank's hooks into its model (model/step_hooks.h): the backward's final gradients to the exchange,
// the gradients laid out for the all-gather, and no device graphs (the collectives are not recorded).
class DataParallelRun : public StepHooks {
 public:
  // A rank of `world` on `backend` (the dry run's shape-only exchange when the backend is a dry
  // run: nothing is opened). Throws UserError when the spec does not suit the world.
  DataParallelRun(const World& world, Backend& backend, const DataParallelSpec& spec);
  ~DataParallelRun() override;
  const World& world() const { return world_; }
  Communicator& communicator() { return *comm_; }
  const DataParallelSpec& spec() const { return spec_; }
  bool main_rank() const { return world_.rank == 0; }

  // Before AdamW is made: the exchange hooks into the model (Transformer::set_hooks, until this is
  // destroyed), and, with take_rank0_parameters (the parameters set, initialised or loaded), every
  // rank takes rank 0's, as DDP's constructor does. A resumed run's ranks load the same checkpoint after
  // AdamW is made instead.
  void attach(Transformer& model, bool take_rank0_parameters = true);

  void gradient_ready(std::size_t param) override;
  // ZeRO-3: a stretch's parameters gathered before it reads them, and freed after.
  void acquire(std::span<Parameter* const> params, Pass pass) override;
  void release(std::span<Parameter* const> params, Pass pass) override;
  GradientParts gradient_parts() const override;
  bool allows_graphs() const override { return false; }
  // The sharding AdamW takes (ZeRO-1, 2 and 3), nullptr otherwise; valid after attach.
  OptimizerSharding* sharding() { return zero_.get(); }
  // Tells AdamW its gradients are the sum of the world's (it divides by the world's size).
  void configure(AdamW& optimizer) const { optimizer.set_gradient_sum_of(world_.size); }
  // After each micro-batch's backward (see GradientSync::after_backward; nothing with ZeRO, whose
  // exchange the optimizer's step finishes).
  void after_backward(MicroBatch micro);
  // The mean of every rank's x (a loss for the log): one small all-reduce.
  double mean_over_ranks(double x);

 private:
  // DataParallelSpec::exchange_sms in a world of several, else 0.
  int held_sms() const;
  World world_;
  Backend& backend_;
  Transformer* model_ = nullptr;  // the model hooked into
  DataParallelSpec spec_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Communicator> comm_;  // declared before what uses it: destroyed after them
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<ZeroSharding> zero_;
};

}  // namespace lmscope::parallel
