#include "lmscope/bench/runner.h"

#include "lmscope/bench/trace_session.h"

#include "lmscope/backend/backend.h"
#include "lmscope/run/session.h"
#include "lmscope/run/step_driver.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <new>
#include <numeric>
#include <tuple>

namespace lmscope {

double peak_tflops(const std::string& device_name, const std::string& precision) {
  // Dense tensor-core (bf16, tf32) and CUDA-core (fp32) peaks from NVIDIA's datasheets, TFLOP/s.
  struct Peak {
    const char* name;
    double bf16, tf32, fp32;  // dense; fp16's tensor-core peak is bf16's on these cards
  };
  static const Peak peaks[] = {{"H100 80GB HBM3", 989.4, 494.7, 66.9},  // SXM5
                               {"H100 PCIe", 756.0, 378.0, 51.2},
                               {"H200", 989.4, 494.7, 66.9},
                               {"A100", 312.0, 156.0, 19.5}};
  for (const Peak& p : peaks)
    if (device_name.find(p.name) != std::string::npos)
      return precision == "bf16" || precision == "fp16" ? p.bf16 : precision == "tf32" ? p.tf32 : p.fp32;
  return 0;
}

PhaseStats summarize(std::vector<double> ms) {
  PhaseStats s;
  s.n = static_cast<int>(ms.size());
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  s.min = ms.front();
  s.max = ms.back();
  s.median = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  s.mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
  double ss = 0;
  for (double x : ms) ss += (x - s.mean) * (x - s.mean);
  s.std = ms.size() > 1 ? std::sqrt(ss / static_cast<double>(ms.size() - 1)) : 0.0;
  return s;
}

namespace {

// The time the collectives' spans overlap [0, until) (ms from the step's start).
double overlap_ms(const std::vector<parallel::Communicator::Span>& spans, double until) {
  double ms = 0;
  for (const auto& s : spans) ms += std::max(0.0, std::min(s.end_ms, until) - s.start_ms);
  return ms;
}

// Times each phase by marks in the backend's stream (CUDA events on the GPU), so no phase waits for
// the host, and the whole step by a host clock around a synchronised region, the seeds' method. With
// spec.profile, a tracer records every kernel of the measured steps, tagged with its phase; with
// spec.trace, the ranges the driver and the model mark, every allocation and the device's work.
class PhaseTimer : public StepObserver {
 public:
  PhaseTimer(const BenchSpec& spec, Session& session, const BenchProgress& progress)
      : spec_(spec), session_(session), backend_(session.backend()), progress_(progress) {}

  void step_begin(std::int64_t i) override {
    measured_ = i >= spec_.warmup;
    if (i == spec_.warmup) {
      if (AdamW* opt = session_.optimizer()) skipped_before_ = opt->loss_scaler().skipped();
      graphs_before_ = backend_.graph_counts();
    }
    backend_.synchronize();
    if (spec_.trace && i == spec_.warmup) {
      trace_ = std::make_unique<TraceSession>(
          backend_, TraceLabels{fmt::format("lmscope bench: {} {} {} {} batch {} ctx {}", spec_.model.name,
                                            spec_.device, spec_.precision, spec_.label(), spec_.batch, spec_.ctx)});
      tracer_ = trace_->kernel_tracer();
    }
    if (spec_.profile && i == spec_.warmup && !tracer_) {
      own_tracer_ = backend_.kernel_tracer();
      if (!own_tracer_)
        throw Unsupported(fmt::format("--profile traces GPU kernels; the {} backend has none", spec_.device));
      tracer_ = own_tracer_.get();
    }
    t0_ = std::chrono::steady_clock::now();
    marks_ = {backend_.mark()};
    if (session_.data_parallel() && measured_) session_.data_parallel()->communicator().start_timing();
  }
  void phase_begin(StepPhase p, int) override {
    if (!tracer_) return;
    tracer_->set_phase(p == StepPhase::forward     ? Phase::forward
                       : p == StepPhase::optimizer ? Phase::optimizer
                                                   : Phase::backward);
  }
  void phase_end(StepPhase, int) override { marks_.push_back(backend_.mark()); }
  void step_end(const StepResult& result) override {
    backend_.synchronize();
    const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    if (measured_) record(host_ms);
    backend_.clear_marks();
    const int done = static_cast<int>(result.iteration) + 1;
    if (progress_) progress_(done, spec_.warmup + spec_.steps);
  }

  // The measured steps' figures into r.
  void finish(BenchResult& r) {
    const RunSpec& spec = session_.spec();
    if (trace_) {
      TraceSession::Result t = trace_->finish();
      r.trace = std::move(t.json);
      if (spec_.profile) r.kernels = summarize_kernels(t.device.work, spec_.steps);
    } else if (own_tracer_) {
      r.kernels = summarize_kernels(own_tracer_->finish().work, spec_.steps);
    }
    const Backend::GraphCounts graphs = backend_.graph_counts();
    r.graphs = {graphs.recorded - graphs_before_.recorded, graphs.replayed - graphs_before_.replayed, graphs.given_up};
    AdamW* opt = session_.optimizer();
    if (opt && opt->loss_scaler().on()) {
      r.skipped_steps = opt->loss_scaler().skipped() - skipped_before_;
      r.loss_scale = opt->loss_scaler().scale();
    }
    r.forward = summarize(fwd_);
    if (has_backward(spec.mode)) r.backward = summarize(bwd_);
    if (opt) r.optimizer = summarize(optim_);
    r.step = summarize(step_);
    if (session_.data_parallel()) {
      r.communication = summarize(comm_);
      r.exchange = summarize(exchange_);
      r.hidden_share = summarize(hidden_).mean;
    }
  }

 private:
  // marks_: the step's start, then the end of each micro-batch's forward and backward, of the
  // exchange and of the optimizer.
  void record(double host_ms) {
    const int micro_batches = session_.spec().micro_batches();
    double f = 0, b = 0;
    for (int k = 0; k < micro_batches; ++k) {
      f += backend_.elapsed_ms(marks_[2 * k], marks_[2 * k + 1]);
      b += backend_.elapsed_ms(marks_[2 * k + 1], marks_[2 * k + 2]);
    }
    fwd_.push_back(f);
    bwd_.push_back(b);
    const int backward_end = 2 * micro_batches;
    exchange_.push_back(backend_.elapsed_ms(marks_[backward_end], marks_[backward_end + 1]));
    optim_.push_back(backend_.elapsed_ms(marks_[backward_end + 1], marks_[backward_end + 2]));
    step_.push_back(host_ms);
    if (parallel::DataParallelRun* dp = session_.data_parallel()) {
      const std::vector<parallel::Communicator::Span> spans = dp->communicator().finish_timing();
      double total = 0;
      for (const auto& s : spans) total += s.end_ms - s.start_ms;
      comm_.push_back(total);
      hidden_.push_back(total > 0 ? overlap_ms(spans, backend_.elapsed_ms(marks_[0], marks_[backward_end])) / total
                                  : 0);
    }
  }

  const BenchSpec& spec_;
  Session& session_;
  Backend& backend_;
  const BenchProgress& progress_;
  bool measured_ = false;
  std::chrono::steady_clock::time_point t0_;
  std::vector<int> marks_;
  std::vector<double> fwd_, bwd_, optim_, step_, comm_, exchange_, hidden_;
  std::unique_ptr<TraceSession> trace_;
  std::unique_ptr<KernelTracer> own_tracer_;
  KernelTracer* tracer_ = nullptr;
  std::int64_t skipped_before_ = 0;  // by the loss scaler, in the warm-up steps
  Backend::GraphCounts graphs_before_;
};

void run_cell(const BenchSpec& spec, BenchResult& r, const BenchProgress& progress, KeptInitialValues* kept) {
  RunSpec checked = spec;  // the run's rules before its tokens are made (a batch past them ran the host dry)
  validate_run(checked);
  // Random tokens, never zeros: the global batch, each rank running its rows of it.
  FixedBatch batch(spec.model.vocab, spec.batch, spec.ctx, spec.seed, "bench.tokens");
  SessionOptions options;
  options.kept = kept;
  options.first_batch = &batch;
  Session session(spec, std::move(options));
  if (parallel::DataParallelRun* dp = session.data_parallel())
    r.collectives_library = parallel::name_and_version(dp->communicator());  // a cell that fails later too
  StepDriver driver(session, batch, false);
  PhaseTimer timer(spec, session, progress);
  driver.add_observer(timer);
  for (int i = 0; i < spec.warmup + spec.steps; ++i) driver.step(i, i - spec.warmup);
  timer.finish(r);
  Backend& backend = session.backend();
  const double loss = session.model().read_loss();
  if (!std::isfinite(loss)) throw std::runtime_error(fmt::format("the loss is {}", loss));
  r.peak_bytes = backend.allocator().peak_bytes();
  const RunSpec& run = session.spec();
  const double tokens = static_cast<double>(run.batch * run.ctx) * run.micro_batches();  // per step, every rank's
  r.tokens_per_s = tokens / (r.step.mean / 1e3);
  const double per_token =
      has_backward(run.mode) ? run.model.train_flops_per_token(run.ctx) : run.model.forward_flops_per_token(run.ctx);
  // Per device: this rank's share of the tokens.
  const double local_tokens = tokens * static_cast<double>(session.local_batch()) / static_cast<double>(run.batch);
  r.model_tflops = per_token * local_tokens / (r.step.mean / 1e3) / 1e12;
  r.device_name = backend.allocator().device_name();
  r.peak_tflops = peak_tflops(r.device_name, run.precision);
  if (r.peak_tflops > 0) r.mfu = r.model_tflops / r.peak_tflops;
}

}  // namespace

bool keeps_initial_weights(const BenchSpec& a, const BenchSpec& b) {
  const ModelConfig &x = a.model, &y = b.model;  // the shapes that name and size the tensors
  return a.device != "cpu" && a.device == b.device && a.seed == b.seed &&
         std::tie(x.vocab, x.d_model, x.d_ff, x.layers) == std::tie(y.vocab, y.d_model, y.d_ff, y.layers);
}

BenchResult BenchSweep::run(const BenchSpec& cell, const BenchSpec* next, const BenchProgress& progress) {
  const bool again = next && keeps_initial_weights(cell, *next);
  // Values kept are the previous cell's, kept because this one builds the same tensors.
  BenchResult r = run_bench_cell(cell, progress, again || !kept_.tensors.empty() ? &kept_ : nullptr);
  if (!again) kept_ = {};
  return r;
}

BenchResult run_bench_cell(const BenchSpec& spec, const BenchProgress& progress, KeptInitialValues* kept) {
  BenchResult r;
  r.spec = spec;
  try {
    run_cell(spec, r, progress, kept);
  } catch (const RankFailure&) {
    throw;  // the ranks cannot go on together: every later cell would wait out the timeout
  } catch (...) {
    r.status = failure_status(std::current_exception());
  }
  return r;
}

std::string failure_status(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const OutOfMemory& e) {
    return fmt::format("OOM: asked for {} with {} in use of {}", human_bytes(static_cast<double>(e.requested())),
                       human_bytes(static_cast<double>(e.in_use())), human_bytes(static_cast<double>(e.capacity())));
  } catch (const Unsupported& e) {
    return fmt::format("unsupported: {}", e.what());
  } catch (const std::bad_alloc&) {  // (its own words are the C++ library's: "std::bad_alloc")
    return "error: the host's memory cannot hold this cell";
  } catch (const std::exception& e) {
    return fmt::format("error: {}", e.what());
  }
}

}  // namespace lmscope
