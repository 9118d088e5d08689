// ZeRO-1 as llm.c shards it: the gradients, bucket by bucket in the backward's order, are
// reduce-scattered so each rank holds the sum of its own slice of every bucket; it updates those
// elements with the moments of them alone (1/N of AdamW's state), and the parameters are then
// all-gathered back into every rank's whole model. Gradients travel in their own dtype (bf16 with
// --grad-dtype bf16), parameters in the master's.
#pragma once

#include "lmscope/model/optimizer.h"
#include "lmscope/parallel/communicator.h"
#include "lmscope/parallel/data_parallel.h"

namespace lmscope::parallel {

class ZeroSharding final : public OptimizerSharding {
 public:
  // bucket_bytes: the exchange's bucket size (each bucket's elements padded to a multiple of the
  // world's size, so every rank's slice has the same length).
  ZeroSharding(Transformer& model, Communicator& comm, std::size_t bucket_bytes);
  const std::vector<ShardPiece>& pieces() const override { return pieces_; }
  std::int64_t shard_elements() const override { return shard_elements_; }
  void reduce_scatter_gradients(const Tensor& shard) override;
  void combine_norms(const Tensor& partial, const Tensor& norm) override;
  void all_gather_parameters() override;
  Allocation whole(std::size_t param, const Tensor& shard) override;

 private:
  struct Slice {
    Bucket bucket;
    std::int64_t padded = 0;        // the bucket's elements rounded up to a multiple of the world's size
    std::int64_t per_rank = 0;      // padded / the world's size: each rank's slice
    std::int64_t shard_offset = 0;  // where this rank's slice sits in the shard
  };
  Allocation bucket_buffer(const Slice& s, DType dtype, const char* what);
  Transformer& model_;
  Communicator& comm_;
  std::vector<Slice> slices_;
  std::vector<ShardPiece> pieces_;
  std::int64_t shard_elements_ = 0;
};

}  // namespace lmscope::parallel
