#include "lmscope/report/html_report.h"

#include "lmscope/core/xml_escape.h"
#include "lmscope/memory/timeline_svg.h"
#include "lmscope/report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

namespace lmscope::report {

namespace {

constexpr const char* kStyle = R"(<style>
body { font-family: sans-serif; margin: 24px 40px; color: #222; max-width: 1200px; }
h1 { font-size: 24px; } h2 { font-size: 20px; margin-top: 36px; border-bottom: 1px solid #ccc; }
h3 { font-size: 16px; margin-top: 24px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border: 1px solid #d0d0d0; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; } td:not(.l) { white-space: nowrap; }
tr.failed td { color: #a33; }
figure { margin: 12px 0; } figcaption { font-size: 12px; color: #555; }
p.note { font-size: 13px; color: #444; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
</style>
)";

std::string ms(const std::map<std::string, Timing>& t, const char* phase) {
  const auto it = t.find(phase);
  if (it == t.end()) return "";
  return fmt::format("{:.3f} ± {:.3f}", it->second.median, it->second.std);
}

double median(const std::map<std::string, Timing>& t, const char* phase) {
  const auto it = t.find(phase);
  return it == t.end() ? 0 : it->second.median;
}

std::string sources(const auto& named) {
  std::string s;
  for (const auto& n : named) s += (s.empty() ? "" : ", ") + fmt::format("<code>{}</code>", xml_escape(n.file));
  return fmt::format("<p class=\"note\">From {}.</p>\n", s);
}

// A chart goes in only when some series has two points to join, or a failure to mark.
bool worth_drawing(const LineChart& c) {
  for (const Series& s : c.series)
    if (s.points.size() > 1 || (!s.points.empty() && !s.failed_x.empty())) return true;
  return false;
}

// Series keyed by name, in the order names first come.
struct SeriesSet {
  std::vector<Series> series;
  std::map<std::string, std::size_t> index;
  Series& operator[](const std::string& name) {
    if (!index.contains(name)) {
      index[name] = series.size();
      series.push_back({name, {}, {}});
    }
    return series[index[name]];
  }
};

bool wide_range(const std::vector<Series>& series) {
  double lo = 1e300, hi = 0;
  for (const Series& s : series)
    for (auto [x, y] : s.points)
      if (y > 0) lo = std::min(lo, y), hi = std::max(hi, y);
  return hi > 30 * lo;
}

std::string device_label(const BenchRow& r) { return r.device_name.empty() ? r.device : r.device_name; }

std::string bench_section(const std::vector<Named<BenchRow>>& files) {
  std::vector<const BenchRow*> rows;
  for (const auto& f : files)
    for (const BenchRow& r : f.rows) rows.push_back(&r);
  std::string s = "<h2 id=\"bench\">Step time (lmscope bench)</h2>\n" + sources(files);
  // One device for every row (the usual case) is said once, not in a column.
  // (bench names the GPU only in rows that ran; a failed row's bare "cuda" is the same device.)
  std::set<std::string> devices, named;
  for (const BenchRow* r : rows) (r->device_name.empty() ? devices : named).insert(device_label(*r));
  for (const std::string& n : named) devices.erase(n.substr(0, n.find(':')));
  devices.insert(named.begin(), named.end());
  const bool one_device = devices.size() == 1;
  s += fmt::format(
      "<p class=\"note\">{}Times in ms: the median of the measured steps ± their standard deviation."
      "</p>\n",
      one_device ? fmt::format("Device: {}. ", xml_escape(*devices.begin())) : "");
  s += std::string("<table><tr><th class=\"l\">model</th>") + (one_device ? "" : "<th class=\"l\">device</th>") +
       "<th class=\"l\">precision</th>"
       "<th class=\"l\">attention</th><th class=\"l\">mode</th><th>batch</th><th>ctx</th><th>forward ms</th>"
       "<th>backward ms</th><th>optimizer ms</th><th>step ms</th><th>tokens/s</th><th>MFU</th><th>peak memory</th>"
       "<th class=\"l\">status</th></tr>\n";
  for (const BenchRow* r : rows) {
    s += fmt::format(
        "<tr{}><td class=\"l\">{}</td>{}<td class=\"l\">{}</td><td class=\"l\">{}</td>"
        "<td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>\n",
        r->ok() ? "" : " class=\"failed\"", xml_escape(r->model + (r->dry_run ? " (dry run)" : "")),
        one_device ? "" : fmt::format("<td class=\"l\">{}</td>", xml_escape(device_label(*r))),
        xml_escape(r->precision), xml_escape(r->attention), xml_escape(r->mode), r->batch, r->ctx, ms(r->ms, "forward"),
        ms(r->ms, "backward"), ms(r->ms, "optimizer"), ms(r->ms, "step"),
        r->tokens_per_s > 0 ? fmt::format("{:.0f}", r->tokens_per_s) : "",
        r->mfu > 0 ? fmt::format("{:.1f}%", 100 * r->mfu) : "", r->peak_bytes > 0 ? human_bytes(r->peak_bytes) : "",
        xml_escape(r->status));
  }
  s += "</table>\n<div class=\"charts\">\n";

  // Step time against context (a line per model and setting) and against model size (per context).
  SeriesSet by_ctx, by_size;
  std::set<std::string> models;
  for (const BenchRow* r : rows) {
    if (r->dry_run) continue;
    const std::string setting = fmt::format("{} {} {} b{}{}", r->precision, r->attention, r->mode, r->batch,
                                            one_device ? "" : " on " + device_label(*r));
    Series& c = by_ctx[r->model + " " + setting];
    Series& m = by_size[fmt::format("ctx {} {}", r->ctx, setting)];
    if (r->ok() && r->ms.contains("step")) {
      c.points.emplace_back(static_cast<double>(r->ctx), median(r->ms, "step"));
      m.points.emplace_back(static_cast<double>(r->parameters) / 1e6, median(r->ms, "step"));
      models.insert(r->model);
    } else if (r->status.rfind("OOM", 0) == 0) {
      c.failed_x.push_back(static_cast<double>(r->ctx));
      m.failed_x.push_back(static_cast<double>(r->parameters) / 1e6);
    }
  }
  LineChart ctx_chart{"Step time against context", "context (tokens)", "step ms (median)", true,
                      wide_range(by_ctx.series),   by_ctx.series};
  if (worth_drawing(ctx_chart)) s += svg_line_chart(ctx_chart);
  LineChart size_chart{"Step time against model size", "parameters (millions)", "step ms (median)", true,
                       wide_range(by_size.series),     by_size.series};
  if (models.size() > 1 && worth_drawing(size_chart)) s += svg_line_chart(size_chart);

  // Where a step's time goes: by phase, and by kernel category where the rows were profiled.
  StackedBars phases{
      "Where a step's time goes", "ms per step (medians)", {}, {"forward", "backward", "optimizer"}, {}, {}};
  StackedBars kernels{"Kernel time by category (bench --profile)", "ms per step", {}, {}, {}, {}};
  std::map<std::string, std::size_t> category;
  for (const BenchRow* r : rows) {
    if (!r->ok() || r->dry_run) continue;
    phases.bars.push_back(r->cell());
    phases.values.push_back({median(r->ms, "forward"), median(r->ms, "backward"), median(r->ms, "optimizer")});
    if (r->kernel_ms.empty()) continue;
    kernels.bars.push_back(r->cell());
    std::vector<double> v(kernels.parts.size());
    for (const auto& [phase, cats] : r->kernel_ms)
      for (const auto& [cat, t] : cats) {
        if (!category.contains(cat)) {
          category[cat] = kernels.parts.size();
          kernels.parts.push_back(cat);
        }
        v.resize(kernels.parts.size());
        v[category[cat]] += t;
      }
    kernels.values.push_back(v);
  }
  if (!phases.bars.empty()) s += svg_stacked_bars(phases);
  if (!kernels.bars.empty()) s += svg_stacked_bars(kernels);
  return s + "</div>\n";
}

std::string memory_section(const std::vector<Named<MemoryRow>>& files,
                           const std::vector<std::pair<std::string, std::string>>& timelines) {
  std::string s = "<h2 id=\"memory\">Memory (lmscope memory)</h2>\n";
  // The timeline's kinds, stacked in its order and drawn in its colours.
  const MemKind kinds[] = {MemKind::parameter, MemKind::optimizer_state, MemKind::gradient,
                           MemKind::input,     MemKind::workspace,       MemKind::activation};
  if (!files.empty()) {
    s += sources(files);
    s += "<table><tr><th class=\"l\">cell</th><th class=\"l\">device</th><th>peak</th>";
    for (MemKind k : kinds) s += fmt::format("<th>{}</th>", mem_kind_name(k));
    s += "<th class=\"l\">status</th></tr>\n";
    StackedBars bars{"Memory at the peak, by kind", "GiB", {}, {}, {}, {}};
    for (MemKind k : kinds) {
      bars.parts.push_back(mem_kind_name(k));
      bars.colours.push_back(mem_kind_colour(k));
    }
    for (const auto& f : files)
      for (const MemoryRow& r : f.rows) {
        s += fmt::format("<tr{}><td class=\"l\">{}</td><td class=\"l\">{}{}</td><td>{}</td>",
                         r.ok() ? "" : " class=\"failed\"", xml_escape(r.cell()), xml_escape(r.device),
                         r.dry_run ? " (dry run)" : "", r.peak_bytes > 0 ? human_bytes(r.peak_bytes) : "");
        std::vector<double> v;
        for (MemKind k : kinds) {
          const auto it = r.peak_by_kind.find(mem_kind_name(k));
          const double b = it == r.peak_by_kind.end() ? 0 : it->second;
          s += fmt::format("<td>{}</td>", human_bytes(b));
          v.push_back(b / (1024.0 * 1024 * 1024));
        }
        s += fmt::format("<td class=\"l\">{}</td></tr>\n", xml_escape(r.status));
        if (r.peak_bytes > 0) {
          bars.bars.push_back(r.cell());
          bars.values.push_back(v);
        }
      }
    s += "</table>\n";
    if (!bars.bars.empty()) s += svg_stacked_bars(bars);
  }
  for (const auto& [file, svg] : timelines)
    s += fmt::format("<figure>{}<figcaption>Active memory over one step: <code>{}</code></figcaption></figure>\n", svg,
                     xml_escape(file));
  return s;
}

std::string attention_section(const std::vector<Named<AttentionRow>>& files) {
  std::string s = "<h2 id=\"attention\">Attention (lmscope attention)</h2>\n" + sources(files) +
                  "<p class=\"note\">Times in ms: the median of the timed passes ± their standard deviation.</p>\n";
  s += "<table><tr><th class=\"l\">attention</th><th class=\"l\">device</th><th class=\"l\">precision</th>"
       "<th>batch</th><th>seq</th><th>d</th><th>forward ms</th><th>backward ms</th><th>fwd+bwd ms</th>"
       "<th>saved for backward</th><th class=\"l\">status</th></tr>\n";
  SeriesSet time, saved;
  // What tells settings apart beyond impl, precision, d and batch, named only where it varies.
  std::set<std::string> variants, devices;
  for (const auto& f : files)
    for (const AttentionRow& r : f.rows) {
      variants.insert(fmt::format("{} {} {}", r.heads, r.causal, r.deterministic));
      devices.insert(r.device);
    }
  const auto setting = [&](const AttentionRow& r) {
    std::string name = fmt::format("{} {} d {} b{}", r.attention, r.precision, r.d, r.batch);
    if (variants.size() > 1)
      name += fmt::format(" h{}{}{}", r.heads, r.causal ? "" : " non-causal", r.deterministic ? "" : " atomic dq");
    if (devices.size() > 1) name += " on " + r.device;
    return name;
  };
  for (const auto& f : files)
    for (const AttentionRow& r : f.rows) {
      s += fmt::format(
          "<tr{}><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td>"
          "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>\n",
          r.ok() ? "" : " class=\"failed\"", xml_escape(r.attention), xml_escape(r.device), xml_escape(r.precision),
          r.batch, r.seq, r.d, ms(r.ms, "forward"), ms(r.ms, "backward"), ms(r.ms, "forward_backward"),
          r.saved_bytes > 0 ? human_bytes(r.saved_bytes) : "", xml_escape(r.status));
      const std::string name = setting(r);
      if (r.ok()) {
        time[name].points.emplace_back(static_cast<double>(r.seq), median(r.ms, "forward_backward"));
        saved[name].points.emplace_back(static_cast<double>(r.seq), r.saved_bytes / (1024.0 * 1024));
      } else if (r.out_of_memory()) {
        time[name].failed_x.push_back(static_cast<double>(r.seq));
        saved[name].failed_x.push_back(static_cast<double>(r.seq));
      }
    }
  s += "</table>\n";
  // The out-of-memory frontier: per setting, the longest sequence that ran and the first that did not.
  std::string frontier;
  for (const Series& t : time.series) {
    if (t.failed_x.empty()) continue;
    double ran = 0, failed = 0;
    for (auto [x, y] : t.points) ran = std::max(ran, x);
    for (double x : t.failed_x)  // the first failure beyond the longest that ran
      if (x > ran && (failed == 0 || x < failed)) failed = x;
    if (ran == 0)
      frontier += fmt::format("<li>{}: nothing ran; out of memory from seq {:.0f}</li>\n", xml_escape(t.name),
                              *std::min_element(t.failed_x.begin(), t.failed_x.end()));
    else if (failed > 0)
      frontier += fmt::format("<li>{}: ran up to seq {:.0f}; out of memory from seq {:.0f}</li>\n", xml_escape(t.name),
                              ran, failed);
    else
      frontier += fmt::format("<li>{}: ran up to seq {:.0f}, out of memory at some shorter ones</li>\n",
                              xml_escape(t.name), ran);
  }
  if (!frontier.empty()) s += "<p class=\"note\">Where memory ran out:</p><ul class=\"note\">\n" + frontier + "</ul>\n";
  s += "<div class=\"charts\">\n";
  LineChart time_chart{"Attention forward + backward time", "sequence length", "ms (median)", true, true, time.series};
  if (worth_drawing(time_chart)) s += svg_line_chart(time_chart);
  LineChart saved_chart{"Memory saved for backward", "sequence length", "MiB", true, true, saved.series};
  if (worth_drawing(saved_chart)) s += svg_line_chart(saved_chart);
  return s + "</div>\n";
}

// Each run's name in tables and legends: its log's file name without folders and extension, or with
// its folder where two runs' files share a name.
std::vector<std::string> run_names(const std::vector<Named<TrainStep>>& runs) {
  std::vector<std::string> names;
  std::map<std::string, int> uses;
  for (const auto& run : runs) ++uses[std::filesystem::path(run.file).stem().string()];
  for (const auto& run : runs) {
    const std::filesystem::path path(run.file);
    names.push_back(uses[path.stem().string()] > 1 ? (path.parent_path() / path.stem()).string()
                                                   : path.stem().string());
  }
  return names;
}

// Tokens per second over the log's last stretch of one process: a resumed run appends lines whose
// elapsed_s starts again from 0 while tokens go on counting from step 0.
double tokens_per_second(const std::vector<TrainStep>& steps) {
  std::size_t from = 0;
  for (std::size_t i = 1; i < steps.size(); ++i)
    if (steps[i].elapsed_s < steps[i - 1].elapsed_s) from = i;
  const TrainStep &first = steps[from], &last = steps.back();
  const double seconds = last.elapsed_s - first.elapsed_s;
  return seconds > 0 ? (last.tokens - first.tokens) / seconds : 0;
}

std::string training_section(const std::vector<Named<TrainStep>>& runs) {
  std::string s = "<h2 id=\"training\">Training runs (lmscope train --log)</h2>\n" + sources(runs);
  // How far each run's loss is from the first run's, step by step over the steps both logged: the
  // number that says whether a precision changes training (the curves lie on top of each other).
  const std::vector<std::string> names = run_names(runs);
  const std::string& first_run = names.front();
  std::map<long long, double> reference;
  for (const TrainStep& t : runs.front().rows) reference[t.step] = t.loss;
  s += fmt::format(
      "<p class=\"note\">|Δ loss|: the mean distance of a run's loss from {}'s, over the steps both "
      "logged.</p>\n<table><tr><th class=\"l\">run</th><th>steps</th><th>first loss</th><th>last loss</th>"
      "<th>last held-out loss</th><th>|Δ loss|</th><th>skipped steps</th><th>last loss scale</th>"
      "<th>tokens/s</th></tr>\n",
      xml_escape(first_run));
  SeriesSet train, held_out;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto& run = runs[i];
    const std::string& name = names[i];
    long long skipped = 0, common = 0;
    double gap = 0;
    std::optional<double> val;
    for (const TrainStep& t : run.rows) {
      skipped += t.skipped;
      if (const auto it = reference.find(t.step); it != reference.end())
        gap += std::fabs(t.loss - it->second), ++common;
      if (t.val_loss) val = t.val_loss, held_out[name].points.emplace_back(static_cast<double>(t.step), *t.val_loss);
      train[name].points.emplace_back(static_cast<double>(t.step), t.loss);
    }
    const TrainStep &first = run.rows.front(), &last = run.rows.back();
    const double rate = tokens_per_second(run.rows);
    s += fmt::format(
        "<tr><td class=\"l\">{}</td><td>{}</td><td>{:.4f}</td><td>{:.4f}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td></tr>\n",
        xml_escape(name), last.step, first.loss, last.loss, val ? fmt::format("{:.4f}", *val) : "",
        i == 0 || common == 0 ? "" : fmt::format("{:.4f}", gap / static_cast<double>(common)),
        last.loss_scale ? fmt::format("{}", skipped) : "", last.loss_scale ? fmt::format("{:g}", *last.loss_scale) : "",
        rate > 0 && std::isfinite(rate) ? fmt::format("{:.0f}", rate) : "");
  }
  s += "</table>\n<div class=\"charts\">\n";
  LineChart loss{"Training loss", "step", "loss", false, false, train.series};
  if (worth_drawing(loss)) s += svg_line_chart(loss);
  LineChart val{"Held-out loss", "step", "loss", false, false, held_out.series};
  if (worth_drawing(val)) s += svg_line_chart(val);
  return s + "</div>\n";
}

}  // namespace

std::string html_report(const ReportInputs& in) {
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  s += fmt::format("<title>{}</title>\n", xml_escape(in.title)) + kStyle + "</head><body>\n";
  s += fmt::format("<h1>{}</h1>\n", xml_escape(in.title));
  if (!in.bench.empty()) s += bench_section(in.bench);
  if (!in.memory.empty() || !in.timelines.empty()) s += memory_section(in.memory, in.timelines);
  if (!in.attention.empty()) s += attention_section(in.attention);
  if (!in.train.empty()) s += training_section(in.train);
  return s + "</body></html>\n";
}

}  // namespace lmscope::report
