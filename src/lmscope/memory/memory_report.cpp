#include "lmscope/memory/memory_report.h"

#include <nlohmann/json.hpp>

namespace lmscope {
namespace {

double as_gib(std::size_t b) { return static_cast<double>(b) / (1024.0 * 1024 * 1024); }
std::string gib(std::size_t b) { return fmt::format("{:.2f}", as_gib(b)); }
std::string opt_gib(const std::optional<std::size_t>& b) { return b ? gib(*b) : "-"; }
std::string human(std::size_t b) { return human_bytes(static_cast<double>(b)); }
double share(std::size_t part, std::size_t whole) {
  return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

std::string cell_label(const MemoryRecord& r) {
  const BenchSpec& c = r.spec.cell;
  return fmt::format("{} {} {} {} {}, batch {}, ctx {}", c.model.name, c.device, c.precision,
                     attention_name(c.attention), c.label(), c.batch, c.ctx);
}

std::string peak_moment(const MemoryAnalysis& a) {
  if (a.peak_at_start) return "before the step";
  return fmt::format("{}: {}", phase_name(a.peak_phase), buffer_name(a.peak_tag));
}

// The whole device: what it held before the allocator held anything (the CUDA context, cuBLASLt
// and its workspace), the allocator's segments, and what the driver reports after the step.
std::string markdown_device(const MemoryRow& row) {
  const MemoryRecord& r = row.record;
  const MemoryAnalysis& a = row.analysis;
  if (!r.device) return "";
  const DeviceMemory& d = *r.device;
  const std::size_t at_peak = device_need(r, a);
  if (r.spec.dry_run)
    return fmt::format(
        "\nThe whole GPU: the allocator's peak of allocated plus cached is {} ({} as the driver counts its "
        "segments, in 2 MiB pages); with the {} the device holds beyond it ({}), {} of the {} limit.\n",
        human(a.peak_reserved), human(a.peak_segments_on_device), human(d.used_at_start), r.device_source,
        human(at_peak), human(d.total));
  const double other =
      static_cast<double>(d.used) - static_cast<double>(d.used_at_start) - static_cast<double>(a.reserved_at_step_end);
  return fmt::format(
      "\nThe whole GPU ({} of {}): {} was in use when the backend was made (the CUDA context and cuBLASLt; "
      "its workspace is the allocator's). The allocator held at most {} (allocated plus cached), so the device's peak, "
      "in the driver's pages, "
      "was about {}. After "
      "the step the driver reports {} in use: {} from before, {} held by the allocator ({} of it cached and free), "
      "{} besides ({} of it the driver's rounding of each block of 1 MiB or more to 2 MiB pages).\n",
      r.device_source, human(d.total), human(d.used_at_start), human(a.peak_reserved), human(at_peak), human(d.used),
      human(d.used_at_start), human(a.reserved_at_step_end), human(a.reserved_at_step_end - a.at_step_end),
      human_bytes(other), human(a.paged_at_step_end - a.reserved_at_step_end));
}

std::string markdown_cell(const MemoryRow& row) {
  const MemoryRecord& r = row.record;
  const MemoryAnalysis& a = row.analysis;
  std::string out = fmt::format("\n### {}{}\n\n", cell_label(r), r.spec.dry_run ? " (dry run)" : "");
  out += fmt::format(
      "Peak {} allocated ({} buffers live), reached in {}; the allocator then held {} (allocated plus cached). "
      "Before the step {}, after it {}.\n\n",
      human(a.peak), a.live_at_peak, peak_moment(a), human(a.reserved_at_peak), human(a.at_step_start),
      human(a.at_step_end));
  out += "| live at the peak, by kind | GiB | share |\n|---|---:|---:|\n";
  for (int k = 0; k < kMemKinds; ++k)
    if (a.peak_by_kind[k] > 0)
      out += fmt::format("| {} | {} | {:.1f}% |\n", mem_kind_name(static_cast<MemKind>(k)), gib(a.peak_by_kind[k]),
                         share(a.peak_by_kind[k], a.peak));
  constexpr std::size_t kOps = 12;
  out += "\n| live at the peak, by op (all layers) | GiB | share |\n|---|---:|---:|\n";
  for (std::size_t i = 0; i < a.peak_by_op.size() && i < kOps; ++i)
    out += fmt::format("| {} | {} | {:.1f}% |\n", a.peak_by_op[i].first, gib(a.peak_by_op[i].second),
                       share(a.peak_by_op[i].second, a.peak));
  if (a.peak_by_op.size() > kOps) out += fmt::format("| ({} more) | | |\n", a.peak_by_op.size() - kOps);
  out += fmt::format(
      "\nThe {} largest buffers live at the peak:\n\n"
      "| buffer | kind | dtype | shape | MiB | made in | asked for at |\n|---|---|---|---|---:|---|---|\n",
      a.top.size());
  for (const LiveBuffer& b : a.top)
    out += fmt::format("| {} | {} | {} | {} | {:.1f} | {} | {} |\n", buffer_name(b.tag), mem_kind_name(b.tag.kind),
                       dtype_name(b.dtype), shape_str(b.shape), static_cast<double>(b.bytes) / (1024.0 * 1024),
                       phase_name(b.phase), buffer_source(b.tag));
  return out + markdown_device(row);
}

std::string markdown(const std::vector<MemoryRow>& rows) {
  std::string out =
      "| model | device | precision | attention | mode | batch | ctx | peak GiB | peak reached in | forward peak | "
      "backward peak | optimizer peak | held at backward | status |\n"
      "|---|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|\n";
  for (const MemoryRow& row : rows) {
    const MemoryRecord& r = row.record;
    const MemoryAnalysis& a = row.analysis;
    const BenchSpec& c = r.spec.cell;
    out += fmt::format("| {} | {}{} | {} | {} | {} | {} | {} | ", c.model.name, c.device,
                       r.spec.dry_run ? " (dry run)" : "", c.precision, attention_name(c.attention), c.label(), c.batch,
                       c.ctx);
    if (!row.recorded) {
      out += fmt::format("- | - | - | - | - | - | {} |\n", r.status);
      continue;
    }
    out +=
        fmt::format("{} | {} | {} | {} | {} | {} | {} |\n", gib(a.peak), peak_moment(a),
                    opt_gib(a.phase_peak[static_cast<int>(Phase::forward)]),
                    opt_gib(a.phase_peak[static_cast<int>(Phase::backward)]),
                    opt_gib(a.phase_peak[static_cast<int>(Phase::optimizer)]), opt_gib(a.held_at_backward), r.status);
  }
  for (const MemoryRow& row : rows)
    if (row.recorded) out += markdown_cell(row);
  return out;
}

std::string opt_bytes(const std::optional<std::size_t>& b) { return b ? std::to_string(*b) : ""; }

std::string csv(const std::vector<MemoryRow>& rows) {
  std::string out =
      "model,device,dry_run,precision,attention,mode,recompute,grad_accum,weight_copies,grad_dtype,master_dtype,batch,"
      "ctx,"
      "peak_bytes,"
      "peak_phase,"
      "peak_buffer,"
      "forward_peak_bytes,backward_peak_bytes,optimizer_peak_bytes,held_at_backward_bytes,step_start_bytes,"
      "peak_reserved_bytes";
  for (int k = 0; k < kMemKinds; ++k) out += fmt::format(",peak_{}_bytes", mem_kind_name(static_cast<MemKind>(k)));
  out += ",device_own_bytes,device_used_bytes,device_total_bytes,device_name,status\n";
  for (const MemoryRow& row : rows) {
    const MemoryRecord& r = row.record;
    const MemoryAnalysis& a = row.analysis;
    const BenchSpec& c = r.spec.cell;
    out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{}", csv_field(c.model.name), c.device,
                       r.spec.dry_run ? 1 : 0, c.precision, attention_name(c.attention), step_mode_name(c.mode),
                       recompute_name(c.recompute), c.grad_accum, weight_copies_name(c.weight_copies),
                       grad_dtype_name(c.grad_dtype), master_dtype_name(c.master_dtype), c.batch, c.ctx);
    if (!row.recorded) {
      out +=
          std::string(9 + kMemKinds + 3, ',') + fmt::format(",{},{}\n", csv_field(r.device_name), csv_field(r.status));
      continue;
    }
    out += fmt::format(",{},{},{},{},{},{},{},{},{}", a.peak, a.peak_at_start ? "" : phase_name(a.peak_phase),
                       a.peak_at_start ? "" : csv_field(buffer_name(a.peak_tag)),
                       opt_bytes(a.phase_peak[static_cast<int>(Phase::forward)]),
                       opt_bytes(a.phase_peak[static_cast<int>(Phase::backward)]),
                       opt_bytes(a.phase_peak[static_cast<int>(Phase::optimizer)]), opt_bytes(a.held_at_backward),
                       a.at_step_start, a.peak_reserved);
    for (int k = 0; k < kMemKinds; ++k) out += fmt::format(",{}", a.peak_by_kind[k]);
    const auto& d = r.device;
    out += fmt::format(",{},{},{},{},{}\n", d ? std::to_string(d->used_at_start) : "",
                       d && !r.spec.dry_run ? std::to_string(d->used) : "", d ? std::to_string(d->total) : "",
                       csv_field(r.device_name), csv_field(r.status));
  }
  return out;
}

nlohmann::ordered_json buffer_json(const LiveBuffer& b) {
  return {{"name", buffer_name(b.tag)}, {"kind", mem_kind_name(b.tag.kind)}, {"what", b.tag.what},
          {"layer", b.tag.layer},       {"dtype", dtype_name(b.dtype)},      {"shape", b.shape},
          {"bytes", b.bytes},           {"phase", phase_name(b.phase)},      {"source", buffer_source(b.tag)}};
}

std::string json(const std::vector<MemoryRow>& rows) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const MemoryRow& row : rows) {
    const MemoryRecord& r = row.record;
    const MemoryAnalysis& a = row.analysis;
    const BenchSpec& c = r.spec.cell;
    nlohmann::ordered_json j = c.row();
    j["dry_run"] = r.spec.dry_run;
    j["device_name"] = r.device_name;
    // What the step must fit in: the device's memory, or --memory-limit's (also where the device's
    // own overhead is not known, as on GPUs other than the H100 in a dry run).
    j["budget_bytes"] = device_limit(r);
    j["warmup"] = c.warmup;
    j["status"] = r.status;
    if (row.recorded) {
      j["peak_bytes"] = a.peak;
      j["peak_reached"] = a.peak_at_start ? nlohmann::ordered_json(nullptr)
                                          : nlohmann::ordered_json{{"phase", phase_name(a.peak_phase)},
                                                                   {"buffer", buffer_name(a.peak_tag)},
                                                                   {"source", buffer_source(a.peak_tag)}};
      j["step_start_bytes"] = a.at_step_start;
      j["step_end_bytes"] = a.at_step_end;
      j["peak_reserved_bytes"] = a.peak_reserved;
      j["held_at_backward_bytes"] = a.held_at_backward ? nlohmann::ordered_json(*a.held_at_backward) : nullptr;
      j["held_at_optimizer_bytes"] = a.held_at_optimizer ? nlohmann::ordered_json(*a.held_at_optimizer) : nullptr;
      nlohmann::ordered_json phases;
      for (int p = 0; p < kPhases; ++p)
        if (a.phase_peak[p]) phases[phase_name(static_cast<Phase>(p))] = *a.phase_peak[p];
      j["phase_peak_bytes"] = phases;
      nlohmann::ordered_json kinds;
      for (int k = 0; k < kMemKinds; ++k) kinds[mem_kind_name(static_cast<MemKind>(k))] = a.peak_by_kind[k];
      j["peak_by_kind"] = kinds;
      j["peak_by_op"] = nlohmann::ordered_json::array();
      for (const auto& [op, bytes] : a.peak_by_op) j["peak_by_op"].push_back({{"op", op}, {"bytes", bytes}});
      j["largest_at_peak"] = nlohmann::ordered_json::array();
      for (const LiveBuffer& b : a.top) j["largest_at_peak"].push_back(buffer_json(b));
      if (r.device)
        j["device_memory"] = {{"source", r.device_source},
                              {"total_bytes", r.device->total},
                              {"own_bytes", r.device->used_at_start},
                              {"used_after_step_bytes", r.spec.dry_run ? nlohmann::ordered_json(nullptr)
                                                                       : nlohmann::ordered_json(r.device->used)},
                              {"allocator_reserved_after_step_bytes", a.reserved_at_step_end},
                              {"peak_segments_on_device_bytes", a.peak_segments_on_device},
                              {"need_bytes", device_need(r, a)}};
    }
    out.push_back(j);
  }
  return out.dump(2) + "\n";
}

}  // namespace

MemoryRow memory_row(MemoryRecord record, int top) {
  MemoryRow row;
  row.recorded = record.has_step();
  if (row.recorded) row.analysis = analyze_memory(record, top);
  record.events.clear();
  record.events.shrink_to_fit();
  row.record = std::move(record);
  return row;
}

std::string format_memory(const std::vector<MemoryRow>& rows, ReportFormat f) {
  return format_rows(rows, f, markdown, csv, json);
}

}  // namespace lmscope
