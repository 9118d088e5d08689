// Where a run's tokens come from, behind one interface the step driver reads: a token file sampled
// as the assignment's get_batch does (train), or one seeded batch of random tokens used for every
// step (bench and memory: never zeros, and no file needed). A source gives the whole global batch;
// the driver hands the model this rank's rows of it.
#pragma once

#include "lmscope/io/token_data.h"

#include <cstdint>
#include <string>
#include <vector>

namespace lmscope {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next batch of rows × ctx token ids and their targets into ids and targets (rows·ctx each);
  // false when it is the batch given last time (nothing written, nothing to upload again).
  virtual bool next(std::int32_t* ids, std::int32_t* targets) = 0;
};

// Windows of a token file (BatchSampler: random or sequential), a new batch each call.
class TokenFileBatches : public BatchSource {
 public:
  TokenFileBatches(const TokenData& data, std::int64_t rows, std::int64_t ctx, bool sequential, std::uint64_t seed)
      : sampler_(data, rows, ctx, sequential, seed) {}
  bool next(std::int32_t* ids, std::int32_t* targets) override {
    sampler_.next(ids, targets);
    return true;
  }
  BatchSampler& sampler() { return sampler_; }

 private:
  BatchSampler sampler_;
};

// One batch of tokens drawn uniformly from the vocabulary by the seeded stream `stream` (ids first,
// then targets), the same for every step.
class FixedBatch : public BatchSource {
 public:
  FixedBatch(std::int64_t vocab, std::int64_t rows, std::int64_t ctx, std::uint64_t seed, const std::string& stream);
  bool next(std::int32_t* ids, std::int32_t* targets) override;

 private:
  std::vector<std::int32_t> ids_, targets_;
  bool given_ = false;
};

}  // namespace lmscope
