// Token data as the assignment keeps it: a flat array of ids, either raw little-endian uint16
// (.bin, as np.memmap writes it) or .npy (uint16, int32 or int64, one dimension). Mapped, not read.
#pragma once

#include "lmscope/core/rng.h"

#include <cstdint>
#include <string>

namespace lmscope {

class TokenData {
 public:
  explicit TokenData(const std::string& path);  // throws UserError on unreadable or malformed files
  // Ids the caller holds in memory (a NumPy array), read in place, never copied: the caller keeps them
  // alive. elem_size: 2 (uint16), 4 (int32) or 8 (int64); `name` stands for the path in messages.
  TokenData(const void* ids, std::int64_t count, int elem_size, std::string name);
  ~TokenData();
  TokenData(const TokenData&) = delete;
  TokenData& operator=(const TokenData&) = delete;

  const std::string& path() const { return path_; }
  std::int64_t size() const { return count_; }
  std::int64_t at(std::int64_t i) const;
  // Throws UserError naming the first id outside [0, vocab) and where it sits.
  void check_vocabulary(std::int64_t vocab) const;

 private:
  std::string path_;
  const unsigned char* map_ = nullptr;
  std::size_t map_size_ = 0, offset_ = 0;
  bool mapped_ = false;  // map_ is a mapping of the file (else the caller's memory)
  int elem_size_ = 2;    // 2: uint16, 4: int32, 8: int64
  std::int64_t count_ = 0;
};

// Fills batches of (inputs, targets) windows of ctx tokens, the targets shifted by one.
// random: starts drawn uniformly from [0, size−ctx−1], seeded, as the assignment's get_batch.
// sequential: row b of step s starts at token ((s·B + b) mod W)·ctx, W = ⌊(size−1)/ctx⌋ full
// windows, so a run reads the same tokens anywhere.
class BatchSampler {
 public:
  BatchSampler(const TokenData& data, std::int64_t batch, std::int64_t ctx, bool sequential, std::uint64_t seed);
  void next(std::int32_t* inputs, std::int32_t* targets);
  // Where sampling stands: the random stream's state and the batches drawn. A sampler restored to
  // it draws what the saved one would have drawn next.
  struct Position {
    std::uint64_t rng_state = 0;
    std::int64_t batches = 0;
  };
  Position position() const { return {rng_.state(), step_}; }
  void restore(const Position& p) {
    rng_ = Rng(p.rng_state);
    step_ = p.batches;
  }

 private:
  const TokenData& data_;
  std::int64_t batch_, ctx_, step_ = 0;
  bool sequential_;
  Rng rng_;
};

}  // namespace lmscope
