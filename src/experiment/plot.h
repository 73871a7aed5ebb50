// Plots for experiment results, drawn as SVG by gnuplot (Debian package gnuplot-nox) run as a subprocess.
// All text is drawn literally: names such as "tbt_slo_ms" or "a^b" are not gnuplot markup.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace crescent::experiment {

/// How a plot draws its series.
enum class PlotKind {
  kLines,  // each series: (x, y) points joined by a line
  kBars,   // clustered bars: one cluster per category, one bar per series, labelled with its value
};

/// How a line series is drawn.
enum class LineStyle {
  kSolid,      // solid line with point markers
  kDashed,     // dashed line with point markers
  kReference,  // dotted line without markers: a reference level such as a ceiling
};

// Every member has an initializer, so designated initializers may leave any out.

/// One named series; the name is its legend entry.
struct PlotSeries {
  std::string name{};
  std::vector<double> x{};  // kLines: x of each point; kBars: unused
  std::vector<double> y{};  // kLines: y of each point; kBars: one value per category
  LineStyle style = LineStyle::kSolid;
  int color = -1;           // palette index (series sharing one read as a group); -1: the series' index
  bool right_axis = false;  // plotted against the second y axis, on the right
};

/// A whole figure. Axis labels carry their unit, e.g. "cache capacity (tokens)".
struct Plot {
  std::string title{};
  std::string x_label{};
  std::string y_label{};
  std::string y2_label{};  // the right axis, for series with right_axis
  bool log_x = false;
  bool log_y2 = false;  // log scale on the right axis (values spanning orders of magnitude)
  PlotKind kind = PlotKind::kLines;
  std::vector<std::string> categories{};  // kBars: the clusters, left to right
  std::vector<PlotSeries> series{};
};

/// Draws `plot` as the text of an SVG file (900x540, legend below the axes; y axes start at 0 when no value
/// is negative). Errors: kInvalidArgument for a malformed plot (no series, x and y of different sizes, a bar
/// series without one value per category); kNotFound when gnuplot is not installed; kInternal with
/// gnuplot's error output when it fails.
Result<std::string> render_svg(const Plot& plot);

}  // namespace crescent::experiment
