#include "lmscope/run/batch_source.h"

#include "lmscope/core/rng.h"

#include <algorithm>

namespace lmscope {

FixedBatch::FixedBatch(std::int64_t vocab, std::int64_t rows, std::int64_t ctx, std::uint64_t seed,
                       const std::string& stream)
    : ids_(static_cast<std::size_t>(rows * ctx)), targets_(ids_.size()) {
  Rng rng = Rng::stream(seed, stream);
  for (auto& t : ids_) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
  for (auto& t : targets_) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
}

bool FixedBatch::next(std::int32_t* ids, std::int32_t* targets) {
  if (given_) return false;
  std::copy(ids_.begin(), ids_.end(), ids);
  std::copy(targets_.begin(), targets_.end(), targets);
  given_ = true;
  return true;
}

}  // namespace lmscope
