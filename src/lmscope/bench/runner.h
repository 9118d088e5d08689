// One benchmark cell: build the model on a backend, run warm-up and measured steps of the
// chosen mode, and time each phase (forward, backward, optimizer, whole step) with a host
// timer around a synchronised region, as the seeds' PyTorch scripts do.
#pragma once

#include "lmscope/backend/backend.h"
#include "lmscope/profile/kernel_profile.h"
#include "lmscope/run/run_spec.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace lmscope {

// A bench cell: the run (run/run_spec.h) and how it is measured.
struct BenchSpec : RunSpec {
  int warmup = 5, steps = 10;
  bool profile = false;  // trace every kernel of the measured steps (a backend with a KernelTracer)
  bool trace = false;    // record the measured steps' ranges and memory as a Chrome trace (BenchResult::trace)
};

// The datasheet peak of a GPU for a precision (bf16/tf32 dense tensor cores, fp32 CUDA cores),
// in TFLOP/s; 0 for devices not in the table (docs/timing.md lists it).
double peak_tflops(const std::string& device_name, const std::string& precision);

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
  // Data parallelism: the step's collectives, in all (their spans on the device), and the wait for
  // them after the backward (the exchange phase, between backward and optimizer); hidden_share: the
  // part of the collectives' time that ran during the forward and backward.
  PhaseStats communication, exchange;
  double hidden_share = 0;
  std::string collectives_library;  // the communicator and its library's version ("nccl 2.28.9")
  double tokens_per_s = 0;
  double model_tflops = 0;  // model FLOPs of the mode per step over the mean step time
  std::string device_name;  // as the allocator names it, e.g. "cuda:0 (NVIDIA H100 80GB HBM3)"
  double peak_tflops = 0;   // the device's datasheet peak for the precision; 0 when unknown
  double mfu = 0;           // model_tflops / peak_tflops
  std::size_t peak_bytes = 0;
  // fp16 train cells: measured steps the loss scaler skipped (their gradients overflowed; the
  // optimizer phase made no update), and the scale after the last.
  std::optional<std::int64_t> skipped_steps;
  double loss_scale = 0;
  // Device graphs over the measured steps: recorded (each run once then), and replayed.
  Backend::GraphCounts graphs;
  KernelProfile kernels;  // per measured step; steps == 0 unless spec.profile
  std::string trace;      // with spec.trace: the Chrome trace-event JSON of the measured steps
  // Nothing ran: a dry run's row (bench --dry-run), with its peak_bytes and status and no times.
  bool dry_run = false;
  bool ok() const { return status == "ok"; }
};

// The status row of a cell that threw: "OOM: asked for ...", "unsupported: ..." or "error: ...".
std::string failure_status(const std::exception_ptr& e);

// progress(done, total) is called once per warm-up or measured step.
using BenchProgress = std::function<void(int done, int total)>;
// Never throws for a failing cell: the failure becomes the result's status. With `kept`, the model's
// initial values come from there when an earlier cell drew them (Transformer::init_parameters).
BenchResult run_bench_cell(const BenchSpec& spec, const BenchProgress& progress = {},
                           KeptInitialValues* kept = nullptr);
// Whether a sweep keeps the initial weights from cell a for cell b (run_bench_cell's `kept`): on a GPU,
// where drawing them is the host's slowest part of a cell (seconds at 2.7B), when both build the same
// tensors from the same seed; never on the CPU, whose memory the training uses too and whose steps take
// far longer than the draw. Kept weights take 4 bytes a parameter of host memory in each rank's process.
bool keeps_initial_weights(const BenchSpec& a, const BenchSpec& b);

// A sweep's cells, run one after another: a cell's initial weights are kept for the next where
// keeps_initial_weights(cell, next), and let go once no later cell needs them.
class BenchSweep {
 public:
  BenchResult run(const BenchSpec& cell, const BenchSpec* next, const BenchProgress& progress = {});

 private:
  KeptInitialValues kept_;
};

}  // namespace lmscope
