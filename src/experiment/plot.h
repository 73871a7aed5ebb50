// Plots for experiment results, alone or as panels of a figure, drawn as SVG by gnuplot (Debian package
// gnuplot-nox) run as a subprocess.
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

/// How a line series is drawn. The series with markers of a plot get point types in turn (filled circle,
/// square, triangle, ..., 15 in all before they repeat), so overlapping lines stay told apart.
enum class LineStyle {
  kSolid,      // solid line with point markers
  kDashed,     // dashed line with point markers; a plot's dashed series take 5 dash patterns in turn
  kReference,  // thin dotted line without markers: a reference level such as a ceiling
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

/// A text label pointing at (x, y), e.g. "decode HBM full at 850 s": a small dot at the point with the
/// text beside it (left of the dot when x is in the right half of the data, so it stays inside the plot).
/// x and y are in the plot's axis units (kBars: x is the category's index, 0 for the first; y is on the
/// right axis when right_axis). Notes do not widen the axes' ranges: one outside the data may fall outside
/// the axes, and one at x or y <= 0 on a log axis is left out. The text is drawn literally.
struct PlotNote {
  double x = 0;
  double y = 0;
  std::string text{};
  bool right_axis = false;  // y is on the second (right) y axis; the plot needs a right_axis series
};

/// One set of axes: a whole figure on its own, or a panel of a Figure. Axis labels carry their unit, e.g.
/// "cache capacity (tokens)".
struct Plot {
  std::string title{};
  std::string x_label{};
  std::string y_label{};
  std::string y2_label{};  // the right axis, for series with right_axis
  // true: each y axis starts at 0 unless one of its values is negative (a log axis: gnuplot's autoscale, out
  // to whole decades). false: each y axis spans its data with a margin of 5% of that span either side, so
  // close lines are told apart; a log axis measures the span in decades, and spans whole decades instead
  // when the margin would leave fewer than two powers of 10 (gnuplot labels only those). kBars still rise
  // from 0: a zoomed axis cuts them off at the bottom.
  bool y_from_zero = true;
  bool log_x = false;   // log scale on the x axis, with a tic (SI units: 1M, 3M) at every x of the data
  bool log_y = false;   // log scale on the left axis; gnuplot leaves values <= 0 out
  bool log_y2 = false;  // log scale on the right axis; gnuplot leaves values <= 0 out
  // kLines: x tics only at whole numbers, printed without decimals (e.g. instance counts), every 1, 2, 5,
  // 10, 20, ... so that there are at most 15; with log_x, only the whole-number x of the data get a tic.
  bool integer_x = false;
  // kLines and kBars: left-axis tics only at whole numbers, printed without decimals (counts such as rejected
  // requests), every 1, 2, 5, 10, ... so that there are at most about 10.
  bool integer_y = false;
  PlotKind kind = PlotKind::kLines;
  std::vector<std::string> categories{};  // kBars: the clusters, left to right
  std::vector<PlotSeries> series{};
  std::vector<PlotNote> notes{};
};

/// Several plots in one SVG, laid out row by row in `columns` columns (rows: as many as the panels need),
/// each panel with its own title, axes, kind and legend; `title` (if not empty) is drawn above them all.
/// Note: a braced argument to render_svg naming only members Plot and Figure share, such as
/// render_svg({.title = "t"}), is ambiguous; name the type: render_svg(Plot{.title = "t"}).
struct Figure {
  std::string title{};
  std::vector<Plot> panels{};
  int columns = 1;
  int width_px = 900;  // size of the whole SVG, in pixels
  int height_px = 540;
};

/// Draws `figure` as the text of an SVG file, each panel's legend below its axes. No panel setting (log
/// scales, ranges, tics, notes) carries over to the next panel. Errors: kInvalidArgument for no panels, a
/// columns, width or height < 1, or a malformed panel (named by its number and title; see render_svg(Plot));
/// kNotFound when gnuplot is not installed; kInternal with gnuplot's error output when it fails.
Result<std::string> render_svg(const Figure& figure);

/// Draws `plot` as the text of an SVG file: a figure of that one panel, 900x540 pixels. Errors:
/// kInvalidArgument for a malformed plot (no series, x and y of different sizes, a bar series without one
/// value per category, a note at a non-finite point or on the right axis of a plot without a right-axis
/// series); kNotFound when gnuplot is not installed; kInternal with gnuplot's error output when it fails.
Result<std::string> render_svg(const Plot& plot);

}  // namespace crescent::experiment
