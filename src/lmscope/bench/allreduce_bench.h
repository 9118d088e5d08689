// The all-reduce benchmark of the CS336 assignment (lmscope allreduce): one float32 tensor per size,
// summed across the world's ranks, timed per rank and summarised across ranks, with nccl-tests'
// algorithm and bus bandwidths.
#pragma once

#include "lmscope/bench/report.h"
#include "lmscope/bench/runner.h"
#include "lmscope/parallel/communicator.h"

#include <cstdint>
#include <string>
#include <vector>

namespace lmscope {

class Backend;

// "1MB" -> 1000000: a number (decimals allowed) and a unit, B, KB, MB, GB (powers of 1000, as the
// assignment's sizes are) or KiB, MiB, GiB (powers of 1024), case-insensitive. UserError, naming
// `flag`, for anything else or for a size that is not a positive whole number of float32 values.
std::int64_t parse_byte_size(const std::string& flag, const std::string& text);
// 1000000 -> "1 MB", 1500 -> "1.5 KB": decimal units, as parse_byte_size reads them.
std::string decimal_bytes(std::int64_t bytes);

struct AllreduceBenchSpec {
  std::int64_t bytes = 1000000;  // of float32 values: bytes / 4 elements
  int warmup = 5, iters = 20;
  std::uint64_t seed = 0;  // each rank's values are drawn from (seed, rank)
};

// One size, as every rank saw it (filled in on every rank, alike).
struct AllreduceBenchRow {
  AllreduceBenchSpec spec;
  int world = 1;
  std::string backend, device;  // the communicator ("gloo", "nccl") and the backend's device
  std::string version;          // the communicator's library's, where it says (Communicator::version)
  std::string status = "ok";    // or "OOM: ..." when some rank could not hold the tensor
  // Milliseconds. Each rank times its own iterations; mean is the mean over ranks of each rank's mean,
  // min_rank/max_rank the fastest and slowest rank's mean, and std the sample standard deviation of
  // every iteration of every rank (world · iters times), so it holds both jitter and rank skew.
  double mean_ms = 0, std_ms = 0, min_rank_ms = 0, max_rank_ms = 0;
  // GB/s (10^9 bytes): algbw = bytes / mean; busbw = algbw · 2(n−1)/n, nccl-tests' convention for
  // all-reduce (what each link carries in a ring), so 0 in a world of one, where nothing moves.
  double algbw_gbs = 0, busbw_gbs = 0;
  bool ok() const { return status == "ok"; }
};

// Runs one size on every rank (each must call it with the same spec, in the same order): fills the
// tensor with random values, runs spec.warmup untimed all-reduces, checks once that an all-reduce
// sums (a known pattern; std::runtime_error naming the element on a mismatch), then times spec.iters
// all-reduces, each after a barrier, on the host clock from the call to the backend's synchronize
// (as the assignment's script does). A rank that cannot allocate the tensor makes every rank's row an
// OOM row (the ranks agree by a small all-gather first). progress(done, total) after each iteration.
AllreduceBenchRow run_allreduce_size(Backend& backend, parallel::Communicator& comm, const AllreduceBenchSpec& spec,
                                     const BenchProgress& progress = {});

std::string format_allreduce_bench(const std::vector<AllreduceBenchRow>& rows, ReportFormat f);

}  // namespace lmscope
