#include "lmscope/bench/attention_bench.h"

#include "lmscope/core/rng.h"

#include <chrono>

namespace lmscope {
namespace {

// Times `passes` calls of body, each between two marks in the backend's stream; before() runs
// untimed ahead of each. Stops early once max_seconds of timed work has been measured.
template <typename Before, typename Body>
PhaseStats time_passes(Backend& be, int warmup, int passes, double max_seconds, Before&& before, Body&& body) {
  for (int i = 0; i < warmup; ++i) before(), body();
  std::vector<double> ms;
  double total = 0;
  for (int i = 0; i < passes; ++i) {
    before();
    const int m0 = be.mark();
    body();
    const int m1 = be.mark();
    be.synchronize();  // the seeds synchronise after every pass
    ms.push_back(be.elapsed_ms(m0, m1));
    be.clear_marks();
    total += ms.back();
    if (i >= 2 && total > max_seconds * 1e3) break;
  }
  return summarize(ms);
}

}  // namespace

void check_attention_precision(const std::string& precision) {
  if (precision != "fp32" && precision != "bf16" && precision != "fp16")
    user_error("unknown --precision '{}' for attention (use fp32, bf16 or fp16)", precision);
}

void validate_attention_cell(const AttentionBenchSpec& s) {
  // In doubles, so that nothing overflows here: q, k, v, dO, O and their gradients (n·T·d each), and
  // naive attention's probabilities and their gradient (n·T² each) or flash's log-sum-exps.
  const double n = static_cast<double>(s.batch) * static_cast<double>(s.heads), t = static_cast<double>(s.seq);
  const double bytes = 4 * n * t * (8 * static_cast<double>(s.d) + 2 * (s.kind == AttentionKind::naive ? t : 1));
  if (bytes > static_cast<double>(std::int64_t(1) << 50))
    user_error(
        "{} attention at batch {}, heads {}, seq {} and d {} would hold about {:.2g} bytes, more than the 2^50 "
        "(1 PiB) lmscope plans for; lower --batch, --heads, --seq or --d",
        attention_name(s.kind), s.batch, s.heads, s.seq, s.d, bytes);
}

namespace {

void run(const AttentionBenchSpec& s, AttentionBenchResult& r, const BenchProgress& progress) {
  check_attention_precision(s.precision);
  std::unique_ptr<Backend> be = make_backend(s.device, s.precision);
  Allocator& mem = be->allocator();
  const DType dtype = compute_dtype(s.precision);
  const std::int64_t n = s.batch * s.heads, T = s.seq;
  const Shape shape{n, T, s.d};
  auto buffer = [&](const char* what) { return mem.allocate(shape, dtype, {MemKind::input, what, -1}); };
  Allocation q = buffer("q"), k = buffer("k"), v = buffer("v"), dout = buffer("dout");
  {  // random inputs, never zeros
    Rng rng = Rng::stream(s.seed, "attention.inputs");
    Allocation wide = mem.allocate(shape, DType::f32, {MemKind::workspace, "attention.staging", -1});
    std::vector<float> host(static_cast<std::size_t>(shape_numel(shape)));
    for (Allocation* t : {&q, &k, &v, &dout}) {
      for (float& x : host) x = static_cast<float>(rng.normal());
      be->copy_from_host(wide, host.data());
      be->cast(wide, *t);
    }
  }
  Allocation dq = buffer("dq"), dk = buffer("dk"), dv = buffer("dv");
  r.input_bytes = mem.current_bytes();

  const AttentionCall call{.kind = s.kind, .causal = s.causal, .dq = s.dq, .stats = DType::f32, .layer = -1};
  Allocation o;
  AttentionSaved saved;
  auto forward = [&] {
    o = mem.allocate(shape, dtype, {MemKind::activation, "attn.o", -1});
    attention_forward(*be, call, q, k, v, o, saved);
  };
  auto backward = [&] {
    r.deterministic = attention_backward(*be, call, q, k, v, o, dout, dq, dk, dv, saved) == FlashDq::deterministic;
  };
  auto release = [&] {
    saved = AttentionSaved{};
    o.reset();
  };

  // Memory: what one forward leaves held for backward, then the peak of a forward and backward.
  mem.reset_peak();
  forward();
  be->synchronize();
  r.saved_bytes = mem.current_bytes() - r.input_bytes;
  backward();
  be->synchronize();
  release();
  r.peak_bytes = mem.peak_bytes();
  const std::size_t elem = dtype_size(dtype);
  const std::size_t o_bytes = static_cast<std::size_t>(n * T * s.d) * elem;
  r.saved_bytes_formula = o_bytes + (s.kind == AttentionKind::naive ? static_cast<std::size_t>(n * T * T) * elem
                                                                    : static_cast<std::size_t>(n * T) * 4);

  int done = 0;
  const int total = 3 * (s.warmup + s.iters);
  auto tick = [&] {
    if (progress) progress(++done, total);
  };
  r.forward = time_passes(
      *be, s.warmup, s.iters, s.max_seconds, [&] { release(), tick(); }, forward);
  release();
  r.backward = time_passes(
      *be, s.warmup, s.iters, s.max_seconds, [&] { release(), forward(), tick(); }, backward);
  release();
  r.forward_backward = time_passes(
      *be, s.warmup, s.iters, s.max_seconds, [&] { release(), tick(); }, [&] { forward(), backward(); });
  release();

  const double full =
      4.0 * static_cast<double>(n) * static_cast<double>(T) * static_cast<double>(T) * static_cast<double>(s.d);
  r.forward_flops = s.causal ? full / 2 : full;
  r.backward_flops = 2.5 * r.forward_flops;
  r.peak_tflops = peak_tflops(mem.device_name(), s.precision);
}

}  // namespace

AttentionBenchResult run_attention_cell(const AttentionBenchSpec& spec, const BenchProgress& progress) {
  AttentionBenchResult r;
  r.spec = spec;
  try {
    run(spec, r, progress);
  } catch (...) {
    r.status = failure_status(std::current_exception());
  }
  return r;
}

}  // namespace lmscope
