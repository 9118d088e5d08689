// Tensor parallelism as Megatron-LM splits a Transformer: in each layer q, k, v, w1 and w3 are split
// by columns of their outputs (each rank its heads and its slice of d_ff) and output_proj and w2 by
// rows of their inputs, so the attention and the feed-forward run on each rank's part alone and one
// all-reduce after each row-split product sums the ranks' partial outputs (and one in the backward
// sums the split inputs' gradients). The norms, the embedding and the LM head stay whole on every
// rank, as do the residual stream and every activation between the layers' halves; every rank reads
// the same batch. The model meets it through its StepHooks (model/step_hooks.h): the local shapes,
// the partial sums, and the gradient norm over the ranks' blocks.
#pragma once

#include "lmscope/model/step_hooks.h"
#include "lmscope/parallel/communicator.h"
#include "lmscope/parallel/store.h"

#include <memory>

namespace lmscope {
class Backend;
}

namespace lmscope::parallel {

class TensorParallelRun : public StepHooks {
 public:
  // Rank world.rank of `world`, all of it one tensor-parallel group (the dry run's shape-only
  // communicator when the backend is a dry run: nothing is opened). Given to the model as it is made.
  TensorParallelRun(const World& world, Backend& backend);
  ~TensorParallelRun() override;

  Shape local_shape(const ParameterSpec& spec) const override;
  Block local_block(const ParameterSpec& spec) const override;
  void partial_sum(const Tensor& t, PartialSum where, int layer) override;
  void norm_over_ranks(const Tensor& norm) override;
  std::vector<double> whole_values(const ParameterSpec& whole, const Tensor& local) override;
  bool allows_graphs() const override { return false; }  // the collectives are not recorded

 private:
  // How a parameter is split: not, by the rows of its [out, in] matrix (the output's columns), or
  // by its columns (the input's).
  enum class Split { none, rows, cols };
  static Split split_of(const ParameterSpec& spec);
  World world_;
  Backend& backend_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace lmscope::parallel
