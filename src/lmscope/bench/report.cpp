#include "lmscope/bench/report.h"

#include "lmscope/core/allocator.h"

#include <nlohmann/json.hpp>

namespace lmscope {

ReportFormat parse_report_format(const std::string& s) {
  if (s == "md" || s == "markdown") return ReportFormat::markdown;
  if (s == "csv") return ReportFormat::csv;
  if (s == "json") return ReportFormat::json;
  user_error("unknown --format '{}' (use md, csv or json)", s);
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q(1, '"');
  for (char c : s) {
    if (c == '"') q.push_back('"');
    q.push_back(c);
  }
  q.push_back('"');
  return q;
}

namespace {

std::string mean_std(const PhaseStats& s) { return s.n ? fmt::format("{:.2f} ± {:.2f}", s.mean, s.std) : "-"; }

const char* const kPhases[] = {"forward", "backward", "optimizer", "step"};
const PhaseStats& phase(const BenchResult& r, int i) {
  const PhaseStats* p[] = {&r.forward, &r.backward, &r.optimizer, &r.step};
  return *p[i];
}

// The phases a kernel profile splits a step into, with the phase's mean time from the bench's marks.
struct TimedPhase {
  Phase phase;
  double ms;
};
std::vector<TimedPhase> profiled_phases(const BenchResult& r) {
  std::vector<TimedPhase> out;
  for (auto [p, stats] : {std::pair{Phase::forward, &r.forward}, std::pair{Phase::backward, &r.backward},
                          std::pair{Phase::optimizer, &r.optimizer}})
    if (stats->n > 0) out.push_back({p, stats->mean});
  return out;
}

constexpr int kTopKernels = 15;

// Per phase: time by kernel category and the gaps where the GPU waited for the host; then the
// longest kernels of the step.
std::string markdown_profile(const BenchResult& r) {
  const BenchSpec& s = r.spec;
  const KernelProfile& k = r.kernels;
  std::string out = fmt::format(
      "\n### Where the time goes: {} {} {} {} {}, batch {}, ctx {} (per step, mean of {} measured steps)\n\n"
      "| phase | what | ms | share of phase | launches |\n|---|---|---:|---:|---:|\n",
      s.model.name, s.device, s.precision, attention_name(s.attention), s.label(), s.batch, s.ctx, k.steps);
  for (const TimedPhase& p : profiled_phases(r)) {
    for (const KernelSummary& c : k.categories)
      if (c.phase == p.phase)
        out += fmt::format("| {} | {} | {:.3f} | {:.1f}% | {:.0f} |\n", phase_name(p.phase), c.category, c.ms_per_step,
                           100 * c.ms_per_step / p.ms, c.calls_per_step);
    const double idle = std::max(0.0, p.ms - k.busy_ms(p.phase));
    out += fmt::format("| {} | GPU idle (waiting for launches) | {:.3f} | {:.1f}% | |\n", phase_name(p.phase), idle,
                       100 * idle / p.ms);
  }
  if (k.collective_ms() > 0)
    out += fmt::format(
        "\nCollectives (NCCL's kernels, on their own stream): {:.3f} ms per step, {:.0f}% of it while other kernels "
        "ran.\n",
        k.collective_ms(), 100 * k.collective_overlapped_ms / k.collective_ms());
  out +=
      "\n| phase | kernel | category | calls | ms | µs per call | share of step |\n|---|---|---|---:|---:|---:|---:|\n";
  double step_ms = 0;
  for (const TimedPhase& p : profiled_phases(r)) step_ms += p.ms;
  for (std::size_t i = 0; i < k.kernels.size() && i < kTopKernels; ++i) {
    const KernelSummary& c = k.kernels[i];
    out += fmt::format("| {} | `{}` | {} | {:.0f} | {:.3f} | {:.1f} | {:.1f}% |\n", phase_name(c.phase), c.name,
                       c.category, c.calls_per_step, c.ms_per_step, 1e3 * c.ms_per_step / c.calls_per_step,
                       100 * c.ms_per_step / step_ms);
  }
  if (k.kernels.size() > kTopKernels)
    out += fmt::format("\n({} more kernels; `--format json` lists all.)\n", k.kernels.size() - kTopKernels);
  return out;
}

nlohmann::ordered_json json_profile(const BenchResult& r) {
  nlohmann::ordered_json j;
  j["steps"] = r.kernels.steps;
  if (r.kernels.collective_ms() > 0)
    j["collectives"] = {{"ms", r.kernels.collective_ms()}, {"overlapped_ms", r.kernels.collective_overlapped_ms}};
  for (const TimedPhase& p : profiled_phases(r)) {
    nlohmann::ordered_json ph;
    ph["phase"] = phase_name(p.phase);
    ph["ms"] = p.ms;
    ph["busy_ms"] = r.kernels.busy_ms(p.phase);
    for (const KernelSummary& c : r.kernels.categories)
      if (c.phase == p.phase)
        ph["categories"].push_back({{"category", c.category}, {"ms", c.ms_per_step}, {"launches", c.calls_per_step}});
    j["phases"].push_back(ph);
  }
  for (const KernelSummary& c : r.kernels.kernels)
    j["kernels"].push_back({{"phase", phase_name(c.phase)},
                            {"name", c.name},
                            {"category", c.category},
                            {"calls", c.calls_per_step},
                            {"ms", c.ms_per_step}});
  return j;
}

bool measured_exchange(const BenchResult& r) { return r.ok() && !r.dry_run && r.spec.parallel.data; }

// Data-parallel rows: the collectives' time, what of it the step waited for after the backward, and
// the share that ran beside the forward and backward.
std::string markdown_exchange(const std::vector<BenchResult>& rows) {
  std::string out;
  for (const BenchResult& r : rows) {
    if (!measured_exchange(r)) continue;
    if (out.empty())
      out =
          "\n### Gradient exchange (per step)\n\n| model | mode | batch | ctx | library | collectives ms | exposed "
          "after backward ms | hidden behind the backward |\n|---|---|---:|---:|---|---:|---:|---:|\n";
    const BenchSpec& s = r.spec;
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {:.0f}% |\n", s.model.name, s.label(), s.batch, s.ctx,
                       r.collectives_library, mean_std(r.communication), mean_std(r.exchange), 100 * r.hidden_share);
  }
  return out;
}

std::string markdown(const std::vector<BenchResult>& rows) {
  std::string out =
      "| model | device | precision | attention | mode | batch | ctx | forward ms | backward ms | optimizer ms | "
      "step ms | tokens/s | TFLOP/s | MFU | peak memory | status |\n"
      "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const BenchResult& r : rows) {
    const BenchSpec& s = r.spec;
    out += fmt::format("| {} | {}{} | {} | {} | {} | {} | {} | ", s.model.name, s.device, r.dry_run ? " (dry run)" : "",
                       s.precision, attention_name(s.attention), s.label(), s.batch, s.ctx);
    if (r.dry_run && r.ok())
      out += fmt::format("- | - | - | - | - | - | - | {} | fits |\n", human_bytes(static_cast<double>(r.peak_bytes)));
    else if (r.ok())
      out += fmt::format("{} | {} | {} | {} | {:.0f} | {:.3f} | {} | {} | ok |\n", mean_std(r.forward),
                         mean_std(r.backward), mean_std(r.optimizer), mean_std(r.step), r.tokens_per_s, r.model_tflops,
                         r.mfu > 0 ? fmt::format("{:.1f}%", 100 * r.mfu) : "-",
                         human_bytes(static_cast<double>(r.peak_bytes)));
    else
      out += fmt::format("- | - | - | - | - | - | - | - | {} |\n", r.status);
  }
  for (const BenchResult& r : rows)
    if (r.ok() && r.skipped_steps.value_or(0) > 0)
      out += fmt::format(
          "\n{} {} ctx {}: the loss scaler skipped {} of the {} measured steps (their gradients overflowed fp16; "
          "no update in their optimizer phase); the scale is now {:g}.\n",
          r.spec.model.name, r.spec.precision, r.spec.ctx, *r.skipped_steps, r.spec.steps, r.loss_scale);
  out += markdown_exchange(rows);
  for (const BenchResult& r : rows)
    if (r.ok() && r.kernels.steps > 0) out += markdown_profile(r);
  return out;
}

std::string csv(const std::vector<BenchResult>& rows) {
  std::string out =
      "model,d_model,d_ff,layers,heads,vocab,device,precision,attention,mode,recompute,grad_accum,weight_copies,"
      "grad_dtype,master_dtype,graphs,fusion,batch,ctx,warmup,steps";
  for (const char* p : kPhases)
    for (const char* f : {"mean_ms", "std_ms", "median_ms", "min_ms", "max_ms"}) out += fmt::format(",{}_{}", p, f);
  out += ",tokens_per_s,model_tflops,mfu,peak_bytes,device_name,dry_run,status";
  out +=
      ",world_size,ddp,zero,bucket_mb,symmetric_memory,comm_sms,communication_mean_ms,exchange_mean_ms,hidden_share,"
      "collectives_library,grad_exchange\n";
  for (const BenchResult& r : rows) {
    const BenchSpec& s = r.spec;
    out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}", csv_field(s.model.name),
                       s.model.d_model, s.model.d_ff, s.model.layers, s.model.heads, s.model.vocab, s.device,
                       s.precision, attention_name(s.attention), step_mode_name(s.mode), recompute_name(s.recompute),
                       s.grad_accum, weight_copies_name(s.weight_copies), grad_dtype_name(s.grad_dtype),
                       master_dtype_name(s.master_dtype), s.graphs ? "on" : "off", s.fusion ? "on" : "off", s.batch,
                       s.ctx, s.warmup, s.steps);
    for (int i = 0; i < 4; ++i) {
      const PhaseStats& p = phase(r, i);
      if (p.n)
        out += fmt::format(",{:.4f},{:.4f},{:.4f},{:.4f},{:.4f}", p.mean, p.std, p.median, p.min, p.max);
      else
        out += ",,,,,";
    }
    if (r.dry_run && r.ok())
      out += fmt::format(",,,,{},{}", r.peak_bytes, csv_field(r.device_name));
    else if (r.ok())
      out += fmt::format(",{:.1f},{:.4f},{:.4f},{},{}", r.tokens_per_s, r.model_tflops, r.mfu, r.peak_bytes,
                         csv_field(r.device_name));
    else
      out += ",,,,,";
    out += fmt::format(",{},{}", r.dry_run ? 1 : 0, csv_field(r.status));
    if (s.parallel.data)
      out +=
          fmt::format(",{},{},{},{:g},{},{}", s.parallel.world.size,
                      s.parallel.data->zero ? "" : parallel::ddp_mode_name(s.parallel.data->mode),
                      s.parallel.data->zero, s.parallel.data->bucket_mb,
                      s.parallel.data->zero == 0 && s.parallel.data->symmetric_memory ? "on" : "off", s.exchange_sms());
    else
      out += ",1,,0,,,";
    if (measured_exchange(r))
      out += fmt::format(",{:.4f},{:.4f},{:.4f}", r.communication.mean, r.exchange.mean, r.hidden_share);
    else
      out += ",,,";
    out += "," + csv_field(r.collectives_library);
    out += fmt::format(",{}\n", s.parallel.data && !s.parallel.data->zero
                                    ? parallel::grad_exchange_name(s.parallel.data->exchange)
                                    : "");
  }
  return out;
}

std::string json(const std::vector<BenchResult>& rows) {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const BenchResult& r : rows) {
    const BenchSpec& s = r.spec;
    nlohmann::ordered_json j = s.row();
    if (!r.collectives_library.empty() && s.parallel.data)
      j["data_parallel"]["collectives_library"] = r.collectives_library;
    j["warmup"] = s.warmup;
    j["steps"] = s.steps;
    j["status"] = r.status;
    j["dry_run"] = r.dry_run;
    if (r.dry_run && r.ok()) {
      j["device_name"] = r.device_name;
      j["peak_bytes"] = r.peak_bytes;
    } else if (r.ok()) {
      for (int i = 0; i < 4; ++i) {
        const PhaseStats& p = phase(r, i);
        if (p.n)
          j["ms"][kPhases[i]] = {
              {"mean", p.mean}, {"std", p.std}, {"median", p.median}, {"min", p.min}, {"max", p.max}};
      }
      j["tokens_per_s"] = r.tokens_per_s;
      j["model_tflops"] = r.model_tflops;
      j["device_name"] = r.device_name;
      j["peak_tflops"] = r.peak_tflops;
      j["mfu"] = r.mfu;
      j["peak_bytes"] = r.peak_bytes;
      if (r.graphs.recorded + r.graphs.replayed > 0 || r.graphs.given_up)
        j["device_graphs"] = {
            {"recorded", r.graphs.recorded}, {"replayed", r.graphs.replayed}, {"given_up", r.graphs.given_up}};
      if (r.skipped_steps) {
        j["skipped_steps"] = *r.skipped_steps;
        j["loss_scale"] = r.loss_scale;
      }
      if (r.kernels.steps > 0) j["kernels"] = json_profile(r);
      if (measured_exchange(r)) {
        for (auto [name, p] : {std::pair{"communication", &r.communication}, std::pair{"exchange", &r.exchange}})
          j["ms"][name] = {{"mean", p->mean}, {"std", p->std}, {"median", p->median}, {"min", p->min}, {"max", p->max}};
        j["hidden_share"] = r.hidden_share;
      }
    }
    arr.push_back(j);
  }
  return arr.dump(2) + "\n";
}

}  // namespace

std::string format_bench(const std::vector<BenchResult>& rows, ReportFormat f) {
  return format_rows(rows, f, markdown, csv, json);
}

namespace {

const char* const kAttentionPhases[] = {"forward", "backward", "forward_backward"};
const PhaseStats& attention_phase(const AttentionBenchResult& r, int i) {
  const PhaseStats* p[] = {&r.forward, &r.backward, &r.forward_backward};
  return *p[i];
}
double attention_phase_flops(const AttentionBenchResult& r, int i) {
  return i == 0 ? r.forward_flops : i == 1 ? r.backward_flops : r.forward_flops + r.backward_flops;
}
std::string mib(std::size_t bytes) { return fmt::format("{:.1f}", static_cast<double>(bytes) / (1 << 20)); }

std::string attention_markdown(const std::vector<AttentionBenchResult>& rows) {
  std::string out =
      "| attention | precision | batch·heads | seq | d | causal | dq sum | forward ms | backward ms | fwd+bwd ms | "
      "fwd TFLOP/s | fwd+bwd TFLOP/s | of peak | saved for backward MiB (formula) | peak MiB | status |\n"
      "|---|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const AttentionBenchResult& r : rows) {
    const AttentionBenchSpec& s = r.spec;
    const char* dq_sum = s.kind != AttentionKind::flash || !r.ok() ? "-" : r.deterministic ? "fixed order" : "atomic";
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | ", attention_name(s.kind), s.precision, s.batch * s.heads,
                       s.seq, s.d, s.causal ? "yes" : "no", dq_sum);
    if (!r.ok()) {
      out += fmt::format("- | - | - | - | - | - | - | - | {} |\n", r.status);
      continue;
    }
    const double fb = r.tflops(r.forward_backward, r.forward_flops + r.backward_flops);
    out += fmt::format("{:.3f} | {:.3f} | {:.3f} | {:.3g} | {:.3g} | {} | {} ({}) | {} | ok |\n", r.forward.mean,
                       r.backward.mean, r.forward_backward.mean, r.tflops(r.forward, r.forward_flops), fb,
                       r.peak_tflops > 0 ? fmt::format("{:.1f}%", 100 * fb / r.peak_tflops) : "-", mib(r.saved_bytes),
                       mib(r.saved_bytes_formula), mib(r.peak_bytes));
  }
  return out;
}

std::string attention_csv(const std::vector<AttentionBenchResult>& rows) {
  std::string out = "attention,device,precision,batch,heads,seq,d,causal,deterministic,warmup,iters";
  for (const char* p : kAttentionPhases)
    for (const char* f : {"n", "mean_ms", "std_ms", "median_ms", "min_ms", "max_ms", "tflops"})
      out += fmt::format(",{}_{}", p, f);
  out += ",input_bytes,saved_bytes,saved_bytes_formula,peak_bytes,peak_tflops,status\n";
  for (const AttentionBenchResult& r : rows) {
    const AttentionBenchSpec& s = r.spec;
    out += fmt::format("{},{},{},{},{},{},{},{},{},{},{}", attention_name(s.kind), s.device, s.precision, s.batch,
                       s.heads, s.seq, s.d, s.causal, r.deterministic, s.warmup, s.iters);
    for (int i = 0; i < 3; ++i) {
      const PhaseStats& p = attention_phase(r, i);
      if (p.n)
        out += fmt::format(",{},{:.5f},{:.5f},{:.5f},{:.5f},{:.5f},{:.3f}", p.n, p.mean, p.std, p.median, p.min, p.max,
                           r.tflops(p, attention_phase_flops(r, i)));
      else
        out += ",,,,,,,";
    }
    if (r.ok())
      out += fmt::format(",{},{},{},{},{}", r.input_bytes, r.saved_bytes, r.saved_bytes_formula, r.peak_bytes,
                         r.peak_tflops);
    else
      out += ",,,,,";
    out += "," + csv_field(r.status) + "\n";
  }
  return out;
}

std::string attention_json(const std::vector<AttentionBenchResult>& rows) {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const AttentionBenchResult& r : rows) {
    const AttentionBenchSpec& s = r.spec;
    nlohmann::ordered_json j;
    j["attention"] = attention_name(s.kind);
    j["device"] = s.device;
    j["precision"] = s.precision;
    j["batch"] = s.batch;
    j["heads"] = s.heads;
    j["seq"] = s.seq;
    j["d"] = s.d;
    j["causal"] = s.causal;
    j["deterministic"] = r.deterministic;
    j["status"] = r.status;
    if (r.ok()) {
      for (int i = 0; i < 3; ++i) {
        const PhaseStats& p = attention_phase(r, i);
        j["ms"][kAttentionPhases[i]] = {{"n", p.n},           {"mean", p.mean}, {"std", p.std},
                                        {"median", p.median}, {"min", p.min},   {"max", p.max}};
        j["tflops"][kAttentionPhases[i]] = r.tflops(p, attention_phase_flops(r, i));
      }
      j["bytes"] = {{"inputs", r.input_bytes},
                    {"saved_for_backward", r.saved_bytes},
                    {"saved_for_backward_formula", r.saved_bytes_formula},
                    {"peak", r.peak_bytes}};
      j["peak_tflops"] = r.peak_tflops;
    }
    arr.push_back(j);
  }
  return arr.dump(2) + "\n";
}

}  // namespace

std::string format_attention_bench(const std::vector<AttentionBenchResult>& rows, ReportFormat f) {
  return format_rows(rows, f, attention_markdown, attention_csv, attention_json);
}

}  // namespace lmscope
