#include "lmscope/report/svg_chart.h"

#include "lmscope/core/xml_escape.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace lmscope::report {

const char* chart_colour(std::size_t i) {
  // Tableau 10: distinguishable, and readable on white.
  static const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                         "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return kPalette[i % std::size(kPalette)];
}

namespace {

constexpr int kWidth = 560, kHeight = 380, kLeft = 72, kRight = 24, kTop = 40, kBottom = 56;
constexpr int kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;
constexpr const char* kFont = "font-family=\"sans-serif\"";
constexpr std::size_t kMarkedPoints = 60;  // more points than this: a line without markers

std::string number(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (v == std::round(v) && a < 1e9) return fmt::format("{:.0f}", v);  // 16384, not 1.638e+04
  if (a >= 1e5 || a < 1e-3) return fmt::format("{:.3g}", v);
  return fmt::format("{:.4g}", v);
}

// An axis: where a value goes (0..1 along it) and the ticks to draw.
struct Axis {
  bool log = false;
  double base = 10, lo = 0, hi = 1;
  std::vector<double> ticks;
  double at(double v) const {
    if (log) return (std::log(v) / std::log(base) - lo) / (hi - lo);
    return (v - lo) / (hi - lo);
  }
};

Axis make_axis(double lo, double hi, bool log, double base) {
  Axis a;
  a.log = log;
  a.base = base;
  if (log) {
    a.lo = std::floor(std::log(lo) / std::log(base));
    a.hi = std::ceil(std::log(hi) / std::log(base));
    if (a.hi <= a.lo) a.hi = a.lo + 1;
    const int span = static_cast<int>(std::min(a.hi - a.lo, 4096.0)), step = std::max(1, (span + 8) / 9);
    for (int e = static_cast<int>(a.lo); e <= static_cast<int>(a.hi); e += step) a.ticks.push_back(std::pow(base, e));
    return a;
  }
  lo = std::min(lo, 0.0);  // linear axes start at zero: bars and times are read from it
  if (hi <= lo) hi = lo + 1;
  const double raw = (hi - lo) / 6, mag = std::pow(10, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
  a.lo = std::floor(lo / step) * step;
  a.hi = std::ceil(hi / step) * step;
  for (double t = a.lo; t <= a.hi + step / 2; t += step) a.ticks.push_back(t);
  return a;
}

std::string header(int width, int height, const std::string& title) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" role=\"img\">"
      "<title>{2}</title><rect width=\"{0}\" height=\"{1}\" fill=\"#ffffff\"/>"
      "<text x=\"{3}\" y=\"22\" {4} font-size=\"15\" font-weight=\"bold\" fill=\"#222\">{2}</text>\n",
      width, height, xml_escape(title), kLeft, kFont);
}

std::string legend(const std::vector<std::string>& names, int x, int y, bool marks_failures,
                   const std::vector<std::string>& colours = {}) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const int yy = y + static_cast<int>(i) * 18;
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>", x, yy - 10,
                     i < colours.size() ? colours[i].c_str() : chart_colour(i));
    s += fmt::format("<text x=\"{}\" y=\"{}\" {} font-size=\"12\" fill=\"#222\">{}</text>\n", x + 17, yy, kFont,
                     xml_escape(names[i]));
  }
  if (marks_failures)
    s += fmt::format("<text x=\"{}\" y=\"{}\" {} font-size=\"12\" fill=\"#222\">✕ out of memory</text>\n", x,
                     y + static_cast<int>(names.size()) * 18 + 6, kFont);
  return s;
}

}  // namespace

std::string svg_line_chart(const LineChart& chart) {
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  // Only finite values are drawn, and on a log axis only positive ones.
  bool failures = false;
  for (const Series& s : chart.series) {
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (chart.log_x && x <= 0) || (chart.log_y && y <= 0)) continue;
      xlo = std::min(xlo, x), xhi = std::max(xhi, x), ylo = std::min(ylo, y), yhi = std::max(yhi, y);
    }
    for (double x : s.failed_x) {
      if (chart.log_x && !(x > 0)) continue;
      xlo = std::min(xlo, x), xhi = std::max(xhi, x);
      failures = true;
    }
  }
  const int legend_h = 18 * static_cast<int>(chart.series.size() + (failures ? 1 : 0)) + 8;
  std::string svg = header(kWidth, kHeight + legend_h, chart.title);
  if (!(xlo <= xhi)) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" {} font-size=\"13\" fill=\"#666\">nothing to draw</text></svg>\n",
                       kLeft, kTop + kPlotH / 2, kFont);
    return svg;
  }
  if (!(ylo <= yhi)) ylo = yhi = 1;
  // A logarithmic axis over less than a factor of 4 would show one or two ticks: linear reads better.
  const bool log_x = chart.log_x && xhi >= 4 * xlo, log_y = chart.log_y && yhi >= 4 * ylo;
  const Axis ax = make_axis(xlo, xhi, log_x, 2), ay = make_axis(ylo, yhi, log_y, 10);
  auto px = [&](double x) { return kLeft + ax.at(x) * kPlotW; };
  auto py = [&](double y) { return kTop + (1 - ay.at(y)) * kPlotH; };

  // Grid, ticks and labels.
  for (double t : ay.ticks) {
    svg += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e5e5e5\"/>", kLeft,
                       kLeft + kPlotW, py(t), py(t));
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" {} font-size=\"11\" fill=\"#444\" text-anchor=\"end\">{}</text>\n",
                       kLeft - 6, py(t) + 4, kFont, number(t));
  }
  for (double t : ax.ticks) {
    svg += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{}\" y2=\"{}\" stroke=\"#e5e5e5\"/>", px(t), px(t), kTop,
                       kTop + kPlotH);
    svg +=
        fmt::format("<text x=\"{:.1f}\" y=\"{}\" {} font-size=\"11\" fill=\"#444\" text-anchor=\"middle\">{}</text>\n",
                    px(t), kTop + kPlotH + 16, kFont, number(t));
  }
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>", kLeft, kTop,
                     kPlotW, kPlotH);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" {} font-size=\"12\" fill=\"#222\" text-anchor=\"middle\">{}{}</text>\n",
                     kLeft + kPlotW / 2, kHeight - 14, kFont, xml_escape(chart.x_label), log_x ? " (log scale)" : "");
  svg += fmt::format(
      "<text x=\"16\" y=\"{}\" {} font-size=\"12\" fill=\"#222\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 16 {})\">{}{}</text>\n",
      kTop + kPlotH / 2, kFont, kTop + kPlotH / 2, xml_escape(chart.y_label), log_y ? " (log scale)" : "");

  std::vector<std::string> names;
  for (std::size_t i = 0; i < chart.series.size(); ++i) {
    const Series& s = chart.series[i];
    names.push_back(s.name);
    std::vector<std::pair<double, double>> pts;
    for (auto p : s.points)
      if (std::isfinite(p.first) && std::isfinite(p.second) && !(chart.log_x && p.first <= 0) &&
          !(chart.log_y && p.second <= 0))
        pts.push_back(p);
    std::sort(pts.begin(), pts.end());
    std::string line;
    for (auto [x, y] : pts) line += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    // A dense series (a loss curve, a point per step) is a thinner line without markers, which would
    // hide it.
    const bool dense = pts.size() > kMarkedPoints;
    if (pts.size() > 1)
      svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\"/>", line,
                         chart_colour(i), dense ? "1.2" : "2");
    for (auto [x, y] : dense ? std::vector<std::pair<double, double>>{} : pts)
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>{}: {}, {}</title></circle>",
                         px(x), py(y), chart_colour(i), xml_escape(s.name), number(x), number(y));
    for (double x : s.failed_x)
      if (!log_x || x > 0)
        svg += fmt::format(
            "<text x=\"{:.1f}\" y=\"{}\" {} font-size=\"15\" font-weight=\"bold\" fill=\"{}\" "
            "text-anchor=\"middle\">✕<title>{}: out of memory at {}</title></text>",
            px(x), kTop + kPlotH - 4, kFont, chart_colour(i), xml_escape(s.name), number(x));
    svg += "\n";
  }
  svg += legend(names, kLeft, kHeight + 6, failures);
  return svg + "</svg>\n";
}

std::string svg_stacked_bars(const StackedBars& chart) {
  constexpr int kBarH = 18, kGap = 24, kLabelW = 16, kBarsW = 480;
  const int n = static_cast<int>(chart.bars.size());
  const int height = kTop + 14 + n * (kBarH + kGap) + 44 + 18 * static_cast<int>(chart.parts.size());
  const int width = kLabelW + kBarsW + 110;
  double most = 0;
  for (const auto& row : chart.values) {
    double sum = 0;
    for (double v : row) sum += std::max(v, 0.0);
    most = std::max(most, sum);
  }
  const Axis ax = make_axis(0, most > 0 ? most : 1, false, 10);
  auto px = [&](double v) { return kLabelW + ax.at(v) * kBarsW; };
  std::string svg = header(width, height, chart.title);
  const int bottom = kTop + 14 + n * (kBarH + kGap);
  for (double t : ax.ticks) {
    svg += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#e5e5e5\"/>", px(t),
                       kTop - 4, bottom);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" {} font-size=\"11\" fill=\"#444\" text-anchor=\"middle\">{}</text>",
                       px(t), bottom + 14, kFont, number(t));
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" {} font-size=\"12\" fill=\"#222\" text-anchor=\"middle\">{}</text>\n",
                     kLabelW + kBarsW / 2, bottom + 32, kFont, xml_escape(chart.x_label));
  for (int b = 0; b < n; ++b) {
    const int y = kTop + 14 + b * (kBarH + kGap);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" {} font-size=\"12\" fill=\"#222\">{}</text>", kLabelW, y - 4, kFont,
                       xml_escape(chart.bars[b]));
    double at = 0, total = 0;
    for (std::size_t p = 0; p < chart.parts.size() && p < chart.values[b].size(); ++p) {
      const double v = std::max(chart.values[b][p], 0.0);
      if (v > 0)
        svg += fmt::format(
            "<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"><title>{}: {}</title></rect>",
            px(at), y, px(at + v) - px(at), kBarH,
            p < chart.colours.size() ? chart.colours[p].c_str() : chart_colour(p), xml_escape(chart.parts[p]),
            number(v));
      at += v;
      total += v;
    }
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" {} font-size=\"11\" fill=\"#444\">{}</text>\n", px(at) + 5, y + 14,
                       kFont, number(total));
  }
  svg += legend(chart.parts, kLabelW, bottom + 54, false, chart.colours);
  return svg + "</svg>\n";
}

}  // namespace lmscope::report
