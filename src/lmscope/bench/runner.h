// One benchmark cell: build the model on a backend, run warm-up and measured steps of the
// chosen mode, and time each phase (forward, backward, optimizer, whole step) with a host
// timer around a synchronised region, as the seeds' PyTorch scripts do.
#pragma once

#include "lmscope/bench/bench_mode.h"
#include "lmscope/bench/mode_words.h"
#include "lmscope/dist/data_parallel.h"
#include "lmscope/model/attention.h"
#include "lmscope/model/config.h"
#include "lmscope/model/transformer.h"
#include "lmscope/profile/kernel_profile.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace lmscope {

struct BenchSpec {
  ModelConfig model;
  std::string device = "cpu";
  std::string precision = "fp32";
  AttentionKind attention = AttentionKind::flash;
  BenchMode mode = BenchMode::train;
  std::int64_t batch = 4, ctx = 256;
  int warmup = 5, steps = 10;
  std::uint64_t seed = 0;
  bool profile = false;  // trace every kernel of the measured steps (a backend with a KernelTracer)
  Recompute recompute = Recompute::none;
  int grad_accum = 1;  // micro-batches of `batch` sequences per step (train and forward-backward)
  WeightCopies weight_copies = WeightCopies::kept;  // matters under mixed precision only
  std::string grad_dtype = "fp32";                  // --grad-dtype: fp32, or bf16 under bf16 precision
  bool trace = false;  // record the measured steps' ranges and memory as a Chrome trace (BenchResult::trace)
  // Each phase as one device graph, recorded once and replayed (Transformer::set_graphs), where the
  // backend has them (CUDA).
  bool graphs = true;
  // The fused kernels (Transformer::set_fusion).
  bool fusion = true;
  // Data parallelism (train and forward-backward): this process is rank world.rank of world.size,
  // running batch / world.size of the batch's rows; on the dry run, a rank of a world of that size
  // (nothing is exchanged, every buffer of the exchange is made). Device graphs are off with it.
  std::optional<dist::DataParallelSpec> parallel;
  dist::World world;
};

// The mode as tables show it: "train", with ", selective recompute" where something is recomputed,
// ", 4 micro-batches" where gradients are accumulated, ", transient copies" or ", resident copies"
// where the bf16 weight copies are not kept, ", bf16 gradients" where gradients are bf16, ", graphs
// off" where a CUDA cell runs without device graphs, ", fusion off" where a cell runs the unfused
// ops, and ", DDP bucketed 25 MiB, 2 ranks" or ", ZeRO-1, 2 ranks" with data parallelism
// (", symmetric memory off", ", exchange on 8 SMs" where so).
std::string mode_label(const BenchSpec& s);
// The SMs a data-parallel cell's exchange holds beside its backward (--comm-sms as it comes to):
// 0 but on GPUs in a world of several.
int exchange_sms(const BenchSpec& s);
// UserError unless a data-parallel cell's mode has what is exchanged (DataParallelSpec::check_step);
// nothing for a cell without data parallelism.
void check_parallel_mode(const BenchSpec& s);

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
