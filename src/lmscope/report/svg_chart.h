// Charts as inline SVG for lmscope report: lines over a linear or base-2 logarithmic axis (time or
// memory against context, sequence length or model size), with failed cells marked where they
// failed, and horizontal stacked bars (a step's time by phase or kernel category, memory by kind).
// Self-contained: no fonts, scripts or styles from outside.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace lmscope::report {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in x order
  std::vector<double> failed_x;                   // x where the cell failed (out of memory): a cross on the axis
};

struct LineChart {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;  // base-2 logarithmic axes
  std::vector<Series> series;
};

struct StackedBars {
  std::string title, x_label;
  std::vector<std::string> bars;            // one per row, top to bottom
  std::vector<std::string> parts;           // the stacked parts, in the legend's order
  std::vector<std::vector<double>> values;  // [bar][part], each ≥ 0
  std::vector<std::string> colours;         // per part; empty: the palette's
};

std::string svg_line_chart(const LineChart& chart);
std::string svg_stacked_bars(const StackedBars& chart);

// The chart palette's colour i (cycled), as #rrggbb.
const char* chart_colour(std::size_t i);

}  // namespace lmscope::report
