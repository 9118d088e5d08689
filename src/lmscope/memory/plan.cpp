#include "lmscope/memory/plan.h"

#include "lmscope/memory/memory_analysis.h"

#include <nlohmann/json.hpp>

#include <map>

namespace lmscope {

std::int64_t largest_fitting(std::int64_t step, std::int64_t cap, const std::function<bool(std::int64_t)>& fits) {
  LMSCOPE_CHECK(step > 0 && cap >= step, "largest_fitting needs 0 < step <= cap");
  if (!fits(step)) return 0;
  // In units of step: double until one does not fit (or the cap is passed), then halve the gap.
  const std::int64_t most = cap / step;
  std::int64_t fit = 1, miss = most + 1;
  for (std::int64_t k = 2; k <= most; k *= 2) {
    if (!fits(k * step)) {
      miss = k;
      break;
    }
    fit = k;
  }
  while (miss - fit > 1) {
    const std::int64_t mid = fit + (miss - fit) / 2;
    (fits(mid * step) ? fit : miss) = mid;
  }
  return fit * step;
}

PlanRow plan_cell(const PlanSpec& spec) {
  PlanRow row;
  row.spec = spec;
  const MemorySpec reference{spec.reference, true, spec.memory_limit};
  const MemoryRecord r = record_memory(reference);
  row.device_name = r.device_name;
  row.limit = device_limit(r);
  row.reference_outcome = r.outcome;
  row.reference_status = r.status;
  if (r.has_step()) {
    const MemoryAnalysis a = analyze_memory(r, 1);
    row.reference_peak = a.peak;
    row.reference_need = device_need(r, a);
  }
  const BenchSpec& c = spec.reference;
  row.flops_per_token =
      has_backward(c.mode) ? c.model.train_flops_per_token(c.ctx) : c.model.forward_flops_per_token(c.ctx);
  if (r.outcome == MemoryOutcome::failed) return row;  // e.g. a precision the device lacks: nothing to search

  auto fits = [&](std::int64_t batch, std::int64_t ctx) {
    MemorySpec probe = reference;
    probe.cell.batch = batch;
    probe.cell.ctx = ctx;
    const MemoryRecord p = record_memory(probe, false);
    if (p.outcome == MemoryOutcome::failed && row.failed_probe.empty())
      row.failed_probe = fmt::format("batch {}, ctx {}: {}", batch, ctx, p.status);
    return p.ok();
  };
  row.largest_ctx = largest_fitting(spec.ctx_multiple, kPlanMaxCtx, [&](std::int64_t t) { return fits(c.batch, t); });
  row.largest_batch = largest_fitting(1, kPlanMaxBatch, [&](std::int64_t b) { return fits(b, c.ctx); });
  return row;
}

namespace {

std::string gib(std::size_t b) { return fmt::format("{:.2f}", static_cast<double>(b) / (1024.0 * 1024 * 1024)); }

// The search's answer, or "≥ n" where it stopped at its cap with every value up to it fitting.
bool at_cap(std::int64_t n, std::int64_t step, std::int64_t cap) { return n > 0 && n + step > cap; }
std::string largest(std::int64_t n, std::int64_t step, std::int64_t cap) {
  if (n == 0) return "none";
  return at_cap(n, step, cap) ? fmt::format("≥ {}", n) : std::to_string(n);
}

// A search's answer, or "-" where the reference failed and nothing was searched.
std::string searched(const PlanRow& r, const std::string& answer) {
  return r.reference_outcome == MemoryOutcome::failed ? "-" : answer;
}

std::string peak_cell(const PlanRow& r, std::size_t bytes) {
  return r.reference_outcome == MemoryOutcome::failed ? "-" : gib(bytes);
}

std::string reference_note(const PlanRow& r) {
  std::string note = r.reference_outcome == MemoryOutcome::ok ? "" : r.reference_status;
  if (!r.failed_probe.empty())
    note += (note.empty() ? "" : "; ") + ("a probe failed (counted as not fitting) at " + r.failed_probe);
  return note;
}

std::string markdown(const std::vector<PlanRow>& rows) {
  if (rows.empty()) return "";
  const PlanSpec& first = rows.front().spec;
  const BenchSpec& c = first.reference;
  // One line per budget the rows are held to (one per device).
  std::map<std::string, std::size_t> budgets;
  for (const PlanRow& r : rows)
    if (r.reference_outcome != MemoryOutcome::failed) budgets.emplace(r.device_name, r.limit);
  std::string out = fmt::format(
      "Dry runs of a {} step (after {} warm-up step{}), reference batch {}, ctx {}; contexts in multiples "
      "of {}.\n",
      step_mode_name(c.mode), c.warmup, c.warmup == 1 ? "" : "s", c.batch, c.ctx, first.ctx_multiple);
  for (const auto& [name, limit] : budgets)
    out += fmt::format("Budget of the {}: {} GiB, the whole device (what it holds beyond the allocator included).\n",
                       name, gib(limit));
  out += fmt::format(
      "\n| model | parameters | device | precision | attention | step | peak GiB (batch {0}, ctx {1}) | whole "
      "device GiB | {2} GFLOPs/token (ctx {1}) | largest ctx (batch {0}) | largest batch (ctx {1}) | note |\n"
      "|---|---:|---|---|---|---|---:|---:|---:|---:|---:|---|\n",
      c.batch, c.ctx, step_mode_name(c.mode));
  for (const PlanRow& r : rows) {
    const BenchSpec& s = r.spec.reference;
    out += fmt::format("| {} | {:.3f} B | {} | {} | {} | {} | {} | {} | {:.2f} | {} | {} | {} |\n", s.model.name,
                       static_cast<double>(s.model.parameter_count()) / 1e9, s.device, s.precision,
                       attention_name(s.attention), s.label(), peak_cell(r, r.reference_peak),
                       peak_cell(r, r.reference_need), r.flops_per_token / 1e9,
                       searched(r, largest(r.largest_ctx, r.spec.ctx_multiple, kPlanMaxCtx)),
                       searched(r, largest(r.largest_batch, 1, kPlanMaxBatch)), reference_note(r));
  }
  return out;
}

std::string csv(const std::vector<PlanRow>& rows) {
  std::string out =
      "model,parameters,device,device_name,memory_limit_bytes,precision,attention,mode,recompute,grad_accum,"
      "weight_copies,grad_dtype,master_dtype,warmup,batch,ctx,ctx_multiple,peak_bytes,device_need_bytes,flops_per_"
      "token,"
      "largest_ctx,largest_batch,status,failed_probe\n";
  for (const PlanRow& r : rows) {
    const BenchSpec& s = r.spec.reference;
    const bool measured = r.reference_outcome != MemoryOutcome::failed;
    out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6g},{},{},{},{}\n",
                       csv_field(s.model.name), s.model.parameter_count(), s.device, csv_field(r.device_name), r.limit,
                       s.precision, attention_name(s.attention), step_mode_name(s.mode), recompute_name(s.recompute),
                       s.grad_accum, weight_copies_name(s.weight_copies), grad_dtype_name(s.grad_dtype),
                       master_dtype_name(s.master_dtype), s.warmup, s.batch, s.ctx, r.spec.ctx_multiple,
                       measured ? std::to_string(r.reference_peak) : "",
                       measured ? std::to_string(r.reference_need) : "", r.flops_per_token, r.largest_ctx,
                       r.largest_batch, csv_field(r.reference_status), csv_field(r.failed_probe));
  }
  return out;
}

std::string json(const std::vector<PlanRow>& rows) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const PlanRow& r : rows) {
    const BenchSpec& s = r.spec.reference;
    const bool measured = r.reference_outcome != MemoryOutcome::failed;
    nlohmann::ordered_json j = s.row();
    j.erase("batch");  // the reference cell's, under "reference"
    j.erase("ctx");
    j["device_name"] = r.device_name;
    j["memory_limit_bytes"] = r.limit;
    j["warmup"] = s.warmup;
    j["reference"] = {{"batch", s.batch},
                      {"ctx", s.ctx},
                      {"status", r.reference_status},
                      {"peak_bytes", measured ? nlohmann::ordered_json(r.reference_peak) : nullptr},
                      {"device_need_bytes", measured ? nlohmann::ordered_json(r.reference_need) : nullptr},
                      {"flops_per_token", r.flops_per_token}};
    j["ctx_multiple"] = r.spec.ctx_multiple;
    j["largest_ctx"] = r.largest_ctx;
    j["largest_ctx_at_cap"] = at_cap(r.largest_ctx, r.spec.ctx_multiple, kPlanMaxCtx);
    j["largest_batch"] = r.largest_batch;
    j["largest_batch_at_cap"] = at_cap(r.largest_batch, 1, kPlanMaxBatch);
    j["failed_probe"] =
        r.failed_probe.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.failed_probe);
    out.push_back(j);
  }
  return out.dump(2) + "\n";
}

}  // namespace

std::string format_plan(const std::vector<PlanRow>& rows, ReportFormat f) {
  return format_rows(rows, f, markdown, csv, json);
}

}  // namespace lmscope
