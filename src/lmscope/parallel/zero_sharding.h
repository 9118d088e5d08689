// ZeRO-1 and ZeRO-2 as llm.c and DeepSpeed shard them: the gradients, bucket by bucket in the
// backward's order, are reduce-scattered so each rank holds the sum of its own slice of every bucket;
// it updates those elements with the moments of them alone (1/N of AdamW's state), and the parameters
// are then all-gathered back into every rank's whole model. ZeRO-1 reduce-scatters when the optimizer
// steps, every gradient held until then; ZeRO-2 launches each bucket's reduce-scatter in the step's
// last backward as the bucket's gradients become final and frees them there, so a rank never holds
// more than the buckets in flight beside its 1/N shard of the summed gradients. Gradients travel in
// their own dtype (bf16 with --grad-dtype bf16), parameters in the master's.
//
// ZeRO-3 shards the parameters too, each by itself (a bucket of one): a rank keeps only its piece of
// every fp32 master, beside its pieces of the moments and gradients. The model's StepHooks gather a
// stretch's parameters (a layer, the embedding, the head) before it reads them, in the compute dtype
// (matrix weights under mixed precision are cast before they travel and arrive as the bf16 copies),
// and free them after; the backward gathers them again. Each gradient is reduce-scattered as it
// becomes final, as ZeRO-2's buckets are, and the update needs no all-gather: the next forward's
// gathers read the updated pieces.
#pragma once

#include "lmscope/model/optimizer.h"
#include "lmscope/parallel/communicator.h"
#include "lmscope/parallel/data_parallel.h"

#include <map>
#include <memory>
#include <optional>
#include <utility>

namespace lmscope::parallel {

class ZeroSharding final : public OptimizerSharding {
 public:
  // stage: 1, 2 or 3. bucket_bytes: the exchange's bucket size (each bucket's elements padded to a
  // multiple of the world's size, so every rank's slice has the same length); ZeRO-3's buckets are the
  // parameters, one each. ZeRO-3 takes this rank's pieces of the model's parameters as they are now
  // (every rank's the same) and frees the whole ones.
  ZeroSharding(Transformer& model, Communicator& comm, int stage, std::size_t bucket_bytes);
  ~ZeroSharding() override;
  ZeroSharding(const ZeroSharding&) = delete;
  ZeroSharding& operator=(const ZeroSharding&) = delete;
  const std::vector<ShardPiece>& pieces() const override { return pieces_; }
  std::int64_t shard_elements() const override { return shard_elements_; }
  GradientShard summed_gradients() override;
  void combine_norms(const Tensor& partial, const Tensor& norm) override;
  void all_gather_parameters() override;
  Allocation whole(std::size_t param, const Tensor& shard) override;
  Tensor master(const ShardPiece& piece) override;
  bool shards_parameters() const override { return stage_ == 3; }
  std::vector<double> parameter_values(std::size_t param) override;
  void set_parameter_values(std::size_t param, std::span<const double> values) override;
  // ZeRO-3: these parameters whole on every rank (matrix weights under mixed precision as their
  // compute-dtype copies, the rest in the master's dtype), as one all-gather; release frees them.
  // The stretch that came after this one last time starts gathering at once (StepHooks::acquire).
  void gather(std::span<Parameter* const> params, Pass pass);
  void release(std::span<Parameter* const> params);
  // ZeRO-2 and 3, in the step's last backward, as parameter `param`'s gradient becomes final: a bucket
  // whose gradients are all final goes into its reduce-scatter, and they are freed (ZeRO-1: nothing).
  void gradient_ready(std::size_t param);

 private:
  struct Slice {
    Bucket bucket;
    std::int64_t padded = 0;        // the bucket's elements rounded up to a multiple of the world's size
    std::int64_t per_rank = 0;      // padded / the world's size: each rank's slice
    std::int64_t shard_offset = 0;  // where this rank's slice sits in the shard
  };
  // A bucket's reduce-scatter under way, and what it reads until it is done: the bucket's gradients
  // side by side (with the padding), or the bucket's one gradient itself.
  struct InFlight {
    std::size_t slice = 0;
    Allocation buffer;
    std::unique_ptr<CollectiveWork> work;
  };
  // ZeRO-2 holds at most this many buckets' buffers in flight: a launch first waits for the oldest
  // beyond it (on CUDA the backend's stream waits, the host goes on), bounding the memory they take.
  static constexpr std::size_t kMaxInFlight = 2;
  // ZeRO-3: a stretch's parameters gathering (or gathered), each into a buffer padded as its slice is.
  struct Gathered {
    std::vector<Parameter*> params;
    std::vector<Allocation> buffers;
    std::unique_ptr<CollectiveWork> work;
  };
  Gathered start_gather(std::span<Parameter* const> params);
  void drop_prefetched();  // a prefetch not taken: waited for and freed
  // A stretch by its first parameter and its pass.
  using StretchKey = std::pair<std::size_t, Pass>;
  Allocation bucket_buffer(const Slice& s, DType dtype, const char* what);
  // The elements of `whole` (a parameter's values, any shape) a piece covers.
  static Tensor piece_of(const Tensor& whole, const ShardPiece& piece);
  // Slice s's gradients taken from the model (cast into a buffer and freed, or the one gradient
  // itself), and its reduce-scatter into a new part of `shard` launched.
  InFlight launch(std::size_t s, GradientShard& shard);
  void wait_oldest();
  Transformer& model_;
  Communicator& comm_;
  int stage_;
  std::vector<Slice> slices_;
  std::vector<ShardPiece> pieces_;
  std::int64_t shard_elements_ = 0;
  std::vector<std::size_t> slice_of_;   // parameter index -> its slice
  std::vector<std::size_t> pending_;    // per slice: gradients not yet final this step (ZeRO-2)
  std::vector<InFlight> in_flight_;     // oldest first (ZeRO-2)
  GradientShard gradient_shard_;        // ZeRO-2 and 3: the sums, a part made as each bucket launches
  Allocation master_;                   // ZeRO-3: this rank's pieces of every parameter, in the shard's layout
  std::optional<Gathered> prefetched_;  // ZeRO-3: the stretch expected next
  std::map<StretchKey, std::vector<Parameter*>> next_;  // the stretch that followed each
  std::optional<StretchKey> last_;                      // the stretch gathered last
};

}  // namespace lmscope::parallel
