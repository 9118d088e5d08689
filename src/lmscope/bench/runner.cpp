#include "lmscope/bench/runner.h"

#include "lmscope/bench/trace_session.h"

#include "lmscope/backend/backend.h"
#include "lmscope/core/rng.h"
#include "lmscope/dist/data_parallel_run.h"
#include "lmscope/model/optimizer.h"
#include "lmscope/model/transformer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <tuple>

namespace lmscope {

int exchange_sms(const BenchSpec& s) {
  return s.parallel && s.device == "cuda" && s.world.size > 1 ? s.parallel->exchange_sms() : 0;
}

void check_parallel_mode(const BenchSpec& s) {
  if (s.parallel) s.parallel->check_step(has_backward(s.mode), s.mode == BenchMode::train);
}

std::string mode_label(const BenchSpec& s) {
  std::string label = mode_words({.mode = bench_mode_name(s.mode),
                                  .recompute = recompute_name(s.recompute),
                                  .grad_accum = has_backward(s.mode) ? s.grad_accum : 1,
                                  .weight_copies = weight_copies_name(s.weight_copies),
                                  .grad_dtype = s.grad_dtype,
                                  .graphs_off_on_cuda = !s.graphs && s.device == "cuda",
                                  .fusion = s.fusion});
  if (s.parallel) {
    const dist::DataParallelSpec& p = *s.parallel;
    if (p.zero == 1)
      label += fmt::format(", ZeRO-1 ({:g} MiB buckets)", p.bucket_mb);
    else if (p.mode == dist::DdpMode::bucketed)
      label += fmt::format(", DDP bucketed {:g} MiB", p.bucket_mb);
    else
      label += fmt::format(", DDP {}", dist::ddp_mode_name(p.mode));
    if (p.zero == 0 && p.exchange == dist::GradExchange::all_gather) label += ", gradients all-gathered";
    if (p.zero == 0 && !p.symmetric_memory) label += ", symmetric memory off";
    if (exchange_sms(s) > 0) label += fmt::format(", exchange on {} SMs", exchange_sms(s));
    label += fmt::format(", {} rank{}", s.world.size, s.world.size == 1 ? "" : "s");
  }
  return label;
}

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
double overlap_ms(const std::vector<dist::Communicator::Span>& spans, double until) {
  double ms = 0;
  for (const auto& s : spans) ms += std::max(0.0, std::min(s.end_ms, until) - s.start_ms);
  return ms;
}

void run_cell(const BenchSpec& spec, BenchResult& r, const BenchProgress& progress, KeptInitialValues* kept) {
  check_parallel_mode(spec);
  if (spec.parallel) dist::use_rank_gpu(spec.world, spec.device);
  std::unique_ptr<Backend> backend = make_backend(spec.device, spec.precision);
  Transformer model(spec.model, *backend, DType::f32, compute_dtype(spec.precision), spec.attention);
  model.set_recompute(spec.recompute);
  model.set_weight_copies(spec.weight_copies);
  model.set_grad_dtype(gradient_dtype(spec.grad_dtype));
  model.set_graphs(spec.graphs);  // (off once a data-parallel run attaches: DataParallelRun::attach)
  model.set_fusion(spec.fusion);
  model.init_parameters(spec.seed, kept);
  std::unique_ptr<dist::DataParallelRun> dp;
  if (spec.parallel) {
    dp = std::make_unique<dist::DataParallelRun>(spec.world, *backend, *spec.parallel);
    r.collectives_library = dist::name_and_version(dp->communicator());  // a cell that fails later too
    dp->attach(model);
  }
  const std::int64_t n = spec.batch * spec.ctx;  // the global batch: each rank runs its rows of it
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n)), targets(static_cast<std::size_t>(n));
  Rng rng = Rng::stream(spec.seed, "bench.tokens");  // random tokens, never zeros
  for (auto& t : ids) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(spec.model.vocab)));
  for (auto& t : targets) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(spec.model.vocab)));
  const std::int64_t local_batch = dp ? dp->local_batch(spec.batch) : spec.batch;
  const std::size_t first = static_cast<std::size_t>((dp ? dp->first_row(spec.batch) : 0) * spec.ctx);
  model.set_batch(local_batch, spec.ctx, ids.data() + first, targets.data() + first);
  std::unique_ptr<AdamW> opt;
  if (spec.mode == BenchMode::train) {
    opt = std::make_unique<AdamW>(model, OptimizerConfig{}, dp ? dp->sharding() : nullptr);
    if (dp) dp->configure(*opt);
  }

  // Phases are timed by marks in the backend's stream (CUDA events on the GPU), so no phase waits
  // for the host; the whole step by a host clock around a synchronised region, the seeds' method.
  // With spec.profile, a tracer records every kernel of the measured steps, tagged with its phase.
  std::vector<double> fwd, bwd, optim, step, comm, exchange, hidden;
  // With spec.trace, the ranges the runner and the model mark, every allocation and the device's
  // work of the measured steps; its kernel tracer serves the profile too (one tracer at a time).
  std::unique_ptr<TraceSession> trace;
  std::unique_ptr<KernelTracer> own_tracer;
  KernelTracer* tracer = nullptr;
  auto enter = [&](Phase p) {
    if (tracer) tracer->set_phase(p);
  };
  const int total = spec.warmup + spec.steps;
  const int micro_batches = has_backward(spec.mode) ? spec.grad_accum : 1;
  std::vector<int> step_marks;
  std::int64_t skipped_before = 0;  // by the loss scaler, in the warm-up steps
  Backend::GraphCounts graphs_before;
  for (int i = 0; i < total; ++i) {
    if (opt && i == spec.warmup) skipped_before = opt->loss_scaler().skipped();
    if (i == spec.warmup) graphs_before = backend->graph_counts();
    backend->synchronize();
    if (spec.trace && i == spec.warmup) {
      trace = std::make_unique<TraceSession>(
          *backend, TraceLabels{fmt::format("lmscope bench: {} {} {} {} batch {} ctx {}", spec.model.name, spec.device,
                                            spec.precision, mode_label(spec), spec.batch, spec.ctx)});
      tracer = trace->kernel_tracer();
    }
    if (spec.profile && i == spec.warmup && !tracer) {
      own_tracer = backend->kernel_tracer();
      if (!own_tracer)
        throw Unsupported(fmt::format("--profile traces GPU kernels; the {} backend has none", spec.device));
      tracer = own_tracer.get();
    }
    RangeListener* ranges = backend->range_listener();
    const auto t0 = std::chrono::steady_clock::now();
    {
      ScopedRange whole(ranges, RangeLevel::step, "step", i - spec.warmup);
      // Each micro-batch's forward and backward; a phase's time is their sum.
      std::vector<int> marks{backend->mark()};
      if (dp && i >= spec.warmup) dp->communicator().start_timing();
      for (int k = 0; k < micro_batches; ++k) {
        enter(Phase::forward);
        {
          ScopedRange r(ranges, RangeLevel::phase, "forward");
          model.forward(spec.mode != BenchMode::inference);
        }
        marks.push_back(backend->mark());
        enter(Phase::backward);
        {
          ScopedRange r(ranges, RangeLevel::phase, has_backward(spec.mode) ? "backward" : "discard");
          if (!has_backward(spec.mode))
            model.discard_activations();
          else
            model.backward({k, micro_batches});
        }
        marks.push_back(backend->mark());
      }
      if (dp) {  // the collectives the backward started, waited for (naive and flat: run) here
        ScopedRange r(ranges, RangeLevel::phase, "gradient exchange");
        dp->after_backward({micro_batches - 1, micro_batches});
      }
      marks.push_back(backend->mark());
      enter(Phase::optimizer);
      if (opt) {
        ScopedRange r(ranges, RangeLevel::phase, "optimizer");
        opt->step(1e-3);
      }
      marks.push_back(backend->mark());
      backend->synchronize();
      step_marks = std::move(marks);
    }
    const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const std::vector<int>& marks = step_marks;
    if (i >= spec.warmup) {
      double f = 0, b = 0;
      for (int k = 0; k < micro_batches; ++k) {
        f += backend->elapsed_ms(marks[2 * k], marks[2 * k + 1]);
        b += backend->elapsed_ms(marks[2 * k + 1], marks[2 * k + 2]);
      }
      fwd.push_back(f);
      bwd.push_back(b);
      const int backward_end = 2 * micro_batches;
      exchange.push_back(backend->elapsed_ms(marks[backward_end], marks[backward_end + 1]));
      optim.push_back(backend->elapsed_ms(marks[backward_end + 1], marks[backward_end + 2]));
      step.push_back(host_ms);
      if (dp) {
        const std::vector<dist::Communicator::Span> spans = dp->communicator().finish_timing();
        double total = 0;
        for (const auto& s : spans) total += s.end_ms - s.start_ms;
        comm.push_back(total);
        hidden.push_back(total > 0 ? overlap_ms(spans, backend->elapsed_ms(marks[0], marks[backward_end])) / total : 0);
      }
    }
    backend->clear_marks();
    if (progress) progress(i + 1, total);
  }
  if (trace) {
    TraceSession::Result t = trace->finish();
    r.trace = std::move(t.json);
    if (spec.profile) r.kernels = summarize_kernels(t.device.work, spec.steps);
  } else if (own_tracer) {
    r.kernels = summarize_kernels(own_tracer->finish().work, spec.steps);
  }
  const double loss = model.read_loss();
  if (!std::isfinite(loss)) throw std::runtime_error(fmt::format("the loss is {}", loss));
  r.peak_bytes = backend->allocator().peak_bytes();
  const Backend::GraphCounts graphs = backend->graph_counts();
  r.graphs = {graphs.recorded - graphs_before.recorded, graphs.replayed - graphs_before.replayed, graphs.given_up};
  if (opt && opt->loss_scaler().on()) {
    r.skipped_steps = opt->loss_scaler().skipped() - skipped_before;
    r.loss_scale = opt->loss_scaler().scale();
  }
  r.forward = summarize(fwd);
  if (has_backward(spec.mode)) r.backward = summarize(bwd);
  if (opt) r.optimizer = summarize(optim);
  r.step = summarize(step);
  if (dp) {
    r.communication = summarize(comm);
    r.exchange = summarize(exchange);
    r.hidden_share = summarize(hidden).mean;
  }
  const double tokens = static_cast<double>(n) * micro_batches;  // per step, every rank's
  r.tokens_per_s = tokens / (r.step.mean / 1e3);
  const double per_token = has_backward(spec.mode) ? spec.model.train_flops_per_token(spec.ctx)
                                                   : spec.model.forward_flops_per_token(spec.ctx);
  // Per device: this rank's share of the tokens.
  const double local_tokens = tokens * static_cast<double>(local_batch) / static_cast<double>(spec.batch);
  r.model_tflops = per_token * local_tokens / (r.step.mean / 1e3) / 1e12;
  r.device_name = backend->allocator().device_name();
  r.peak_tflops = peak_tflops(r.device_name, spec.precision);
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
  } catch (const std::exception& e) {
    return fmt::format("error: {}", e.what());
  }
}

}  // namespace lmscope
