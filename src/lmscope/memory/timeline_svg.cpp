#include "lmscope/memory/timeline_svg.h"

#include "lmscope/core/xml_escape.h"

#include <algorithm>
#include <cmath>

namespace lmscope {
namespace {

constexpr double kWidth = 1100, kHeight = 560, kLeft = 80, kRight = 250, kTop = 56, kBottom = 60;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;

// Bottom to top: what lives through the step first, what comes and goes last.
constexpr MemKind kStackOrder[] = {MemKind::parameter, MemKind::optimizer_state, MemKind::gradient,
                                   MemKind::input,     MemKind::workspace,       MemKind::activation};
}  // namespace

const char* mem_kind_colour(MemKind k) {
  switch (k) {
    case MemKind::parameter:
      return "#4c72b0";
    case MemKind::gradient:
      return "#dd8452";
    case MemKind::optimizer_state:
      return "#8172b3";
    case MemKind::activation:
      return "#55a868";
    case MemKind::workspace:
      return "#c44e52";
    case MemKind::input:
      return "#937860";
  }
  return "#999";
}

namespace {
const char* phase_fill(Phase p) {
  switch (p) {
    case Phase::forward:
      return "#e8f0fb";
    case Phase::backward:
      return "#fdf0e6";
    case Phase::optimizer:
      return "#efeaf7";
    case Phase::setup:
      return "#f4f4f4";
  }
  return "#fff";
}

// A round step for axis ticks: 1, 2 or 5 times a power of two's GiB... of 1024 for bytes.
double nice_step(double range, int ticks) {
  const double raw = range / ticks, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

struct Band {
  std::string label;
  std::string colour;
  std::vector<double> bytes;  // per sample
};

}  // namespace

std::string memory_timeline_svg(const MemoryRecord& record, const MemoryAnalysis& a, TimelineStack stack) {
  // Samples: the state before the step, then after each alloc or free of it.
  MemoryReplay replay;
  const std::size_t begin = std::min(record.step_begin, record.events.size());
  for (std::size_t i = 0; i < begin; ++i) replay.apply(record.events[i]);
  const int layers = record.spec.cell.model.layers;
  std::vector<Band> bands;
  if (stack == TimelineStack::kind) {
    for (MemKind k : kStackOrder) bands.push_back({mem_kind_name(k), mem_kind_colour(k), {}});
  } else {
    bands.push_back({"everything but activations", "#9aa5b1", {}});
    bands.push_back({"activations outside layers", "#55a868", {}});
    for (int l = 0; l < layers; ++l) {  // hues round the wheel, layer 0 first
      const double hue = 360.0 * l / std::max(layers, 1);
      bands.push_back({fmt::format("layer {}", l), fmt::format("hsl({:.0f},60%,55%)", hue), {}});
    }
  }
  std::vector<Phase> sample_phase;
  std::vector<std::size_t> sample_event;
  auto sample = [&](Phase phase, std::size_t event) {
    if (stack == TimelineStack::kind) {
      for (std::size_t b = 0; b < bands.size(); ++b)
        bands[b].bytes.push_back(static_cast<double>(replay.allocated(kStackOrder[b])));
    } else {
      std::vector<double> per(bands.size(), 0.0);
      for (const LiveBuffer& buf : replay.live()) {
        const std::size_t at = buf.tag.kind != MemKind::activation ? 0 : buf.tag.layer < 0 ? 1 : 2 + buf.tag.layer;
        per[std::min(at, per.size() - 1)] += static_cast<double>(buf.bytes);
      }
      for (std::size_t b = 0; b < bands.size(); ++b) bands[b].bytes.push_back(per[b]);
    }
    sample_phase.push_back(phase);
    sample_event.push_back(event);
  };
  sample(begin < record.events.size() ? record.events[begin].phase : Phase::setup, begin);
  for (std::size_t i = begin; i < record.events.size(); ++i) {
    const MemEvent& e = record.events[i];
    replay.apply(e);
    if (e.action == MemAction::alloc || e.action == MemAction::free) sample(e.phase, i);
  }
  const std::size_t n = sample_phase.size();
  const double top = std::max(static_cast<double>(a.peak), 1.0) * 1.08;
  const double gib = 1024.0 * 1024 * 1024;
  const bool in_gib = top >= gib;
  const double unit = in_gib ? gib : 1024.0 * 1024;
  auto x = [&](std::size_t s) { return kLeft + kPlotW * (n > 1 ? static_cast<double>(s) / (n - 1) : 0.5); };
  auto y = [&](double bytes) { return kTop + kPlotH * (1 - bytes / top); };

  const BenchSpec& c = record.spec.cell;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
      kWidth, kHeight);
  svg += fmt::format("<text x=\"{}\" y=\"22\" font-size=\"16\" font-weight=\"bold\">{}</text>\n", kLeft,
                     xml_escape(fmt::format("Active memory: {} {} {}, {} attention, batch {}, ctx {}", c.model.name,
                                            c.precision, c.label(), attention_name(c.attention), c.batch, c.ctx)));
  // The device on the second line: with a long step label the title would run off the picture.
  svg += fmt::format(
      "<text x=\"{}\" y=\"40\" fill=\"#555\">{}: one step after {} warm-up, {} allocation events; stacked by "
      "{}</text>\n",
      kLeft, xml_escape(record.device_name), c.warmup, n - 1, stack == TimelineStack::kind ? "kind" : "layer");
  // Phases, shaded behind the areas.
  for (std::size_t s = 0; s < n;) {
    std::size_t e = s;
    while (e + 1 < n && sample_phase[e + 1] == sample_phase[s]) ++e;
    const double x0 = x(s), x1 = x(std::min(e + 1, n - 1));
    svg += fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/>\n", x0, kTop,
                       std::max(x1 - x0, 1.0), kPlotH, phase_fill(sample_phase[s]));
    if (x1 - x0 > 50)
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" fill=\"#444\">{}</text>\n", (x0 + x1) / 2,
                         kTop + 14, phase_name(sample_phase[s]));
    s = e + 1;
  }
  // Y grid and labels.
  const double step = nice_step(top / unit, 6) * unit;
  for (double v = 0; v <= top; v += step) {
    svg += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ccc\" stroke-width=\"0.5\"/>\n",
                       kLeft, kLeft + kPlotW, y(v), y(v));
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>\n", kLeft - 6, y(v) + 4, v / unit);
  }
  svg +=
      fmt::format("<text transform=\"translate(20,{:.1f}) rotate(-90)\" text-anchor=\"middle\">allocated ({})</text>\n",
                  kTop + kPlotH / 2, in_gib ? "GiB" : "MiB");
  svg += fmt::format(
      "<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">allocation events of the step (alloc or free)</text>\n",
      kLeft + kPlotW / 2, kHeight - 18);
  // Stacked areas: each band from the running sum below it, as a step function.
  std::vector<double> below(n, 0.0);
  for (const Band& b : bands) {
    if (std::all_of(b.bytes.begin(), b.bytes.end(), [](double v) { return v == 0; })) continue;
    std::string upper, lower;
    for (std::size_t s = 0; s < n; ++s) {
      const double xs = x(s), xe = x(std::min(s + 1, n - 1));
      upper += fmt::format("{:.1f},{:.1f} {:.1f},{:.1f} ", xs, y(below[s] + b.bytes[s]), xe, y(below[s] + b.bytes[s]));
    }
    for (std::size_t s = n; s-- > 0;) {
      const double xs = x(s), xe = x(std::min(s + 1, n - 1));
      lower += fmt::format("{:.1f},{:.1f} {:.1f},{:.1f} ", xe, y(below[s]), xs, y(below[s]));
    }
    svg += fmt::format("<polygon points=\"{}{}\" fill=\"{}\" stroke=\"none\"><title>{}</title></polygon>\n", upper,
                       lower, b.colour, xml_escape(b.label));
    for (std::size_t s = 0; s < n; ++s) below[s] += b.bytes[s];
  }
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", kLeft,
                     kTop, kPlotW, kPlotH);
  // The peak: where, how much, and what reached it.
  std::size_t peak_sample = 0;
  for (std::size_t s = 0; s < n; ++s)
    if (sample_event[s] == a.peak_event) peak_sample = s;
  const double px = x(peak_sample), py = y(static_cast<double>(a.peak));
  const std::string peak_label =
      a.peak_at_start ? fmt::format("peak {} (held before the step)", human_bytes(static_cast<double>(a.peak)))
                      : fmt::format("peak {} in {}: {}", human_bytes(static_cast<double>(a.peak)),
                                    phase_name(a.peak_phase), buffer_name(a.peak_tag));
  svg += fmt::format(
      "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2:.1f}\" stroke=\"black\" "
      "stroke-dasharray=\"4,3\"/>\n<circle cx=\"{0:.1f}\" cy=\"{2:.1f}\" r=\"4\" fill=\"black\"/>\n",
      px, kTop + kPlotH, py);
  const bool left = px > kLeft + kPlotW * 0.6;
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"{}\" font-weight=\"bold\">{}</text>\n",
                     left ? px - 8 : px + 8, std::max(py - 8, kTop + 30.0), left ? "end" : "start",
                     xml_escape(peak_label));
  // Legend, top band first.
  double ly = kTop + 4;
  const double lx = kLeft + kPlotW + 20;
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-weight=\"bold\">at the peak</text>\n", lx, ly + 8);
  ly += 22;
  for (std::size_t b = bands.size(); b-- > 0;) {
    const Band& band = bands[b];
    if (std::all_of(band.bytes.begin(), band.bytes.end(), [](double v) { return v == 0; })) continue;
    if (ly > kTop + kPlotH) break;
    double at_peak = 0;
    if (peak_sample < band.bytes.size()) at_peak = band.bytes[peak_sample];
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>\n", lx, ly - 10, band.colour);
    svg += fmt::format("<text x=\"{}\" y=\"{}\">{} {}</text>\n", lx + 18, ly, xml_escape(band.label),
                       human_bytes(at_peak));
    ly += 18;
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace lmscope
