// One benchmark cell: build the model on a backend, run warm-up and measured steps of the
// chosen mode, and time each phase (forward, backward, optimizer, whole step) with a host
// timer around a synchronised region, as the seeds' PyTorch scripts do.
#pragma once

#include "lmscope/model/config.h"

#include <functional>
#include <string>
#include <vector>

namespace lmscope {

enum class BenchMode { forward, forward_backward, train };
const char* bench_mode_name(BenchMode m);
BenchMode parse_bench_mode(const std::string& s);  // throws UserError

struct BenchSpec {
  ModelConfig model;
  std::string device = "cpu";
  std::string precision = "fp32";
  BenchMode mode = BenchMode::train;
  std::int64_t batch = 4, ctx = 256;
  int warmup = 5, steps = 10;
  std::uint64_t seed = 0;
};

// Milliseconds over the measured steps; std is the sample standard deviation (n − 1).
struct PhaseStats {
  int n = 0;
  double mean = 0, std = 0, median = 0, min = 0, max = 0;
};
PhaseStats summarize(std::vector<double> ms);

struct BenchResult {
  BenchSpec spec;
  std::string status = "ok";  // "ok", "OOM: ...", "unsupported: ...", "error: ..."
  PhaseStats forward, backward, optimizer, step;
  double tokens_per_s = 0;
  double model_tflops = 0;  // model FLOPs of the mode per step over the mean step time
  std::size_t peak_bytes = 0;
  bool ok() const { return status == "ok"; }
};

// progress(done, total) is called once per warm-up or measured step.
using BenchProgress = std::function<void(int done, int total)>;
// Never throws for a failing cell: the failure becomes the result's status.
BenchResult run_bench_cell(const BenchSpec& spec, const BenchProgress& progress = {});

}  // namespace lmscope
