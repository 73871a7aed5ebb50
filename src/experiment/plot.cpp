#include "experiment/plot.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <string_view>

#include "common/atomic_file.h"
#include "common/temp_dir.h"

extern char** environ;

namespace crescent::experiment {
namespace {

namespace fs = std::filesystem;

// Okabe-Ito: distinguishable with colour-blindness, readable on white.
constexpr std::array<std::string_view, 7> kPalette{"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                                   "#E69F00", "#56B4E9", "#000000"};
// Point types (gnuplot's numbers), clearly different from each other: filled circle, square, triangle up,
// triangle down, diamond and pentagon, the same open, then plus, cross and star.
constexpr std::array<int, 15> kPointTypes{7, 5, 9, 11, 13, 15, 6, 4, 8, 10, 12, 14, 1, 2, 3};
// Dash patterns of kDashed series (gnuplot dash types), none like kReference's dotted "3".
constexpr std::array<std::string_view, 5> kDashPatterns{"2", "4", "(12,5)", "5", "(20,6,4,6)"};
// The margin either side of a y axis zoomed to its data: a fraction of the data's span.
constexpr double kYMargin = 0.05;

// `text` as a gnuplot single-quoted string, in which no escapes, backquotes or macros are expanded: only the
// quote itself is doubled, and control characters (a newline would end the command) become spaces.
std::string gnuplot_string(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "''";
    } else {
      out += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
    }
  }
  return out + "'";
}

// A data value; gnuplot leaves NaN points out.
std::string number(double v) {
  return std::isfinite(v) ? fmt::format("{}", v) : "NaN";
}

bool has_right_axis(const Plot& plot) {
  return std::any_of(plot.series.begin(), plot.series.end(),
                     [](const PlotSeries& s) { return s.right_axis; });
}

Status validate(const Plot& plot) {
  if (plot.series.empty()) return Status::invalid_argument(fmt::format("plot '{}': no series", plot.title));
  for (const auto& s : plot.series) {
    const size_t expected = plot.kind == PlotKind::kBars ? plot.categories.size() : s.x.size();
    if (s.y.size() != expected) {
      return Status::invalid_argument(fmt::format("plot '{}': series '{}' has {} values, expected {}",
                                                  plot.title, s.name, s.y.size(), expected));
    }
  }
  for (const auto& note : plot.notes) {
    if (!std::isfinite(note.x) || !std::isfinite(note.y)) {
      return Status::invalid_argument(
          fmt::format("plot '{}': note '{}' is at ({}, {}), expected finite numbers", plot.title, note.text,
                      note.x, note.y));
    }
    if (note.right_axis && !has_right_axis(plot)) {
      return Status::invalid_argument(
          fmt::format("plot '{}': note '{}' is on the right axis, but no series is", plot.title, note.text));
    }
  }
  return Status();
}

Status validate(const Figure& figure) {
  if (figure.panels.empty()) {
    return Status::invalid_argument(fmt::format("figure '{}': no panels", figure.title));
  }
  if (figure.columns < 1 || figure.width_px < 1 || figure.height_px < 1) {
    return Status::invalid_argument(
        fmt::format("figure '{}': {} columns, {}x{} pixels; expected at least 1 column and 1x1 pixels",
                    figure.title, figure.columns, figure.width_px, figure.height_px));
  }
  for (size_t i = 0; i < figure.panels.size(); ++i) {
    if (Status status = validate(figure.panels[i]); !status.ok()) {
      return Status::invalid_argument(
          fmt::format("figure '{}', panel {}: {}", figure.title, i + 1, status.message()));
    }
  }
  return Status();
}

// The lowest and highest finite values of a set (only those > 0 for a log axis); lo > hi when there are none.
struct Span {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();

  void add(double v, bool log) {
    if (!std::isfinite(v) || (log && v <= 0)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

// "[lo:hi]": `span` widened by kYMargin of itself either side (of the decades it spans on a log axis); a
// single value gets a margin of kYMargin of itself (of a decade on a log axis), or of 1 when it is 0. A log
// range holding fewer than two powers of 10 spans whole decades instead: gnuplot labels only those.
std::string zoomed_range(Span span, bool log) {
  if (log) {
    const double lo = std::log10(span.lo), hi = std::log10(span.hi);
    const double margin = hi > lo ? kYMargin * (hi - lo) : kYMargin;
    if (std::floor(hi + margin) - std::ceil(lo - margin) < 1) {
      return fmt::format("[{}:{}]", std::pow(10, std::floor(lo)),
                         std::pow(10, std::max(std::ceil(hi), std::floor(lo) + 1)));
    }
    return fmt::format("[{}:{}]", std::pow(10, lo - margin), std::pow(10, hi + margin));
  }
  double margin = kYMargin * (span.hi - span.lo);
  if (margin == 0) margin = span.hi != 0 ? kYMargin * std::abs(span.hi) : 1;
  return fmt::format("[{}:{}]", span.lo - margin, span.hi + margin);
}

// The smallest of 1, 2, 5, 10, 20, 50, ... that is at least `at_least`.
double whole_step(double at_least) {
  if (!(at_least > 1)) return 1;
  const double decade = std::pow(10, std::floor(std::log10(at_least)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * decade >= at_least) return m * decade;
  }
  return 10 * decade;
}

// The settings of one y axis (the right one when `right`): log scale, and its range.
std::string y_axis(const Plot& plot, bool right) {
  const std::string_view axis = right ? "y2" : "y";
  const bool log = right ? plot.log_y2 : plot.log_y;
  std::string s = log ? fmt::format("set logscale {}\n", axis) : "";  // gnuplot skips values <= 0
  Span span;
  bool negative = false;
  for (const auto& series : plot.series) {
    if (series.right_axis != right) continue;
    for (double y : series.y) {
      span.add(y, log);
      negative |= y < 0;
    }
  }
  if (!right && plot.integer_y && !log && !span.empty()) {
    const double step = whole_step((std::max(span.hi, 0.0) - std::min(span.lo, 0.0)) / 10);
    s += fmt::format("set ytics {}\nset format y '%.0f'\n", step);
  }
  if (span.empty()) {
    // No value to draw (statistics of nothing are NaN): a fixed range, or gnuplot fails "all points y value
    // undefined".
    s += fmt::format("set {}range {}\n", axis, log ? "[1:10]" : "[0:1]");
  } else if (!plot.y_from_zero) {
    s += fmt::format("set {}range {}\n", axis, zoomed_range(span, log));
  } else if (!log && !negative) {
    s += fmt::format("set {}range [0:*]\n", axis);
  }
  return s;
}

// Title, labels, legend and axes: what both kinds share.
std::string preamble(const Plot& plot) {
  std::string s = fmt::format(
      "set title {} font ',14'\nset xlabel {}\nset ylabel {}\n"
      "set key below height 1\nset grid ytics lc rgb '#d0d0d0' dt 3\nset tics nomirror\nset border 3\n",
      gnuplot_string(plot.title), gnuplot_string(plot.x_label), gnuplot_string(plot.y_label));
  bool any_value = false;  // a value that can be drawn: finite, and > 0 on a log axis
  for (const auto& series : plot.series) {
    const bool log = series.right_axis ? plot.log_y2 : plot.log_y;
    for (double y : series.y) any_value |= std::isfinite(y) && (!log || y > 0);
  }
  if (!any_value) s += "set label 'no data' at graph 0.5, 0.5 center noenhanced\n";
  s += y_axis(plot, false);
  if (has_right_axis(plot)) {
    s += fmt::format("set border 11\nset y2label {}\nset y2tics\n", gnuplot_string(plot.y2_label));
    s += y_axis(plot, true);
  }
  return s;
}

// The x of the data of a lines plot (only those > 0 with log_x).
std::set<double> data_x(const Plot& plot) {
  std::set<double> xs;
  for (const auto& series : plot.series) {
    for (double x : series.x) {
      if (std::isfinite(x) && (!plot.log_x || x > 0)) xs.insert(x);
    }
  }
  return xs;
}

// The x axis of lines: the data's span with a margin; log scale and tics.
std::string x_axis(const Plot& plot) {
  std::string s = "set autoscale xfix\nset offsets graph 0.03, graph 0.03, 0, 0\n";
  std::set<double> xs = data_x(plot);
  if (xs.empty()) s += plot.log_x ? "set xrange [1:10]\n" : "set xrange [0:1]\n";  // no x to span
  if (plot.log_x) {
    // A tic at every x of the data (a log axis has few), in SI units: 1M, 3M, 10M.
    if (plot.integer_x) std::erase_if(xs, [](double x) { return x != std::floor(x); });
    if (xs.empty()) return s + "set logscale x\n";
    return s + fmt::format("set logscale x\nset format x '%.0s%c'\nset xtics ({})\n", fmt::join(xs, ", "));
  }
  if (plot.integer_x && !xs.empty()) {
    // At most 15 tics over the whole numbers around the data: 14 steps.
    const double lo = std::floor(*xs.begin()), hi = std::ceil(*xs.rbegin());
    const double step = whole_step((hi - lo) / 14);
    s += fmt::format("set xtics {}, {}\nset format x '%.0f'\n", std::floor(lo / step) * step, step);
  }
  return s;
}

// Each note: a dot at its point, the text beside it (left of the dot in the right half of the data's x).
std::string notes(const Plot& plot) {
  const std::set<double> xs = plot.kind == PlotKind::kLines ? data_x(plot) : std::set<double>{};
  double middle = plot.kind == PlotKind::kBars ? static_cast<double>(plot.categories.size()) / 2 - 0.5 : 0;
  if (!xs.empty()) {
    middle = plot.log_x ? std::sqrt(*xs.begin() * *xs.rbegin()) : (*xs.begin() + *xs.rbegin()) / 2;
  }
  std::string s;
  for (size_t i = 0; i < plot.notes.size(); ++i) {
    const PlotNote& note = plot.notes[i];
    const bool left = note.x > middle;
    s += fmt::format(
        "set label {} {} at first {}, {} {} {} noenhanced front tc rgb '#333333' "
        "point pt 7 ps 0.6 lc rgb '#333333' offset {},0.5\n",
        i + 1, gnuplot_string(note.text), number(note.x), note.right_axis ? "second" : "first",
        number(note.y), left ? "right" : "left", left ? -0.8 : 0.8);
  }
  return s;
}

// One element of the plot command: data `source` drawn as `series` (index `index`) in `style`.
std::string element(std::string_view source, const PlotSeries& series, size_t index, std::string_view style) {
  const size_t color = series.color < 0 ? index : static_cast<size_t>(series.color);
  return fmt::format("{} axes x1y{} title {} with {} lc rgb '{}'", source, series.right_axis ? 2 : 1,
                     gnuplot_string(series.name), style, kPalette[color % kPalette.size()]);
}

// Lines: one datablock per series, named after `panel` and the series. Appends the settings and data to
// `script` and returns the plot elements. Each series with markers gets the next point type, each dashed
// series the next dash pattern.
std::vector<std::string> add_lines(const Plot& plot, size_t panel, std::string& script) {
  script += x_axis(plot);
  std::vector<std::string> elements;
  size_t marked = 0, dashed = 0;
  for (size_t i = 0; i < plot.series.size(); ++i) {
    const PlotSeries& series = plot.series[i];
    script += fmt::format("$p{}s{} << EOD\n", panel, i);
    for (size_t p = 0; p < series.y.size(); ++p) {
      script += fmt::format("{} {}\n", number(series.x[p]), number(series.y[p]));
    }
    script += "EOD\n";
    std::string style = "lines dt 3 lw 1.5";
    if (series.style != LineStyle::kReference) {
      const std::string_view dash =
          series.style == LineStyle::kDashed ? kDashPatterns[dashed++ % kDashPatterns.size()] : "1";
      style = fmt::format("linespoints dt {} pt {} ps 0.8 lw 2", dash,
                          kPointTypes[marked++ % kPointTypes.size()]);
    }
    elements.push_back(element(fmt::format("$p{}s{} using 1:2", panel, i), series, i, style));
  }
  return elements;
}

// Clustered bars: one datablock, named after `panel`, with a row per category and a column per series; each
// bar labelled with its value. Appends the settings and data to `script` and returns the plot elements.
std::vector<std::string> add_bars(const Plot& plot, size_t panel, std::string& script) {
  const size_t n = plot.series.size();
  std::vector<std::string> tics;
  for (size_t c = 0; c < plot.categories.size(); ++c) {
    tics.push_back(fmt::format("{} {}", gnuplot_string(plot.categories[c]), c));
  }
  script += fmt::format(
      "set style histogram clustered gap 1\nset style fill solid 0.85 border -1\n"
      "set xtics ({})\nset xrange [-0.6:{}]\n$p{}bars << EOD\n",
      fmt::join(tics, ", "), static_cast<double>(plot.categories.size()) - 0.4, panel);
  for (size_t c = 0; c < plot.categories.size(); ++c) {
    for (size_t i = 0; i < n; ++i) script += number(plot.series[i].y[c]) + (i + 1 < n ? " " : "\n");
  }
  script += "EOD\n";
  std::vector<std::string> elements;
  for (size_t i = 0; i < n; ++i) {
    elements.push_back(
        element(fmt::format("$p{}bars using {}", panel, i + 1), plot.series[i], i, "histograms"));
  }
  // With gap 1, bar i of a cluster is centred (i - (n-1)/2) / (n+1) off the category's tic.
  for (size_t i = 0; i < n; ++i) {
    const double offset =
        (static_cast<double>(i) - static_cast<double>(n - 1) / 2) / static_cast<double>(n + 1);
    elements.push_back(fmt::format(
        "$p{}bars using ($0+{}):{}:(sprintf('%.4g', column({}))) axes x1y{} notitle with labels offset 0,0.7",
        panel, offset, i + 1, i + 1, plot.series[i].right_axis ? 2 : 1));
  }
  return elements;
}

// The commands of panel number `panel` (from 0): every setting back to gnuplot's default first, so none of
// the previous panel's carries over (multiplot keeps them), then the panel's settings, data and plot.
std::string panel_script(const Plot& plot, size_t panel) {
  std::string s = "reset\n" + preamble(plot) + notes(plot);
  const std::vector<std::string> elements =
      plot.kind == PlotKind::kLines ? add_lines(plot, panel, s) : add_bars(plot, panel, s);
  return s + fmt::format("plot {}\n", fmt::join(elements, ", \\\n     "));
}

// The whole gnuplot script, data inline: a multiplot of the panels, row by row.
std::string script(const Figure& figure) {
  const size_t columns = static_cast<size_t>(figure.columns);
  const size_t rows = (figure.panels.size() + columns - 1) / columns;
  std::string s = fmt::format(
      "set terminal svg size {},{} dynamic noenhanced font 'sans,12' background rgb 'white'\n"
      "set encoding utf8\nset multiplot layout {},{}",
      figure.width_px, figure.height_px, rows, columns);
  if (!figure.title.empty())
    s += fmt::format(" title {} font ',16' noenhanced", gnuplot_string(figure.title));
  s += "\n";
  for (size_t i = 0; i < figure.panels.size(); ++i) s += panel_script(figure.panels[i], i);
  return s + "unset multiplot\n";
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `text` with every run of whitespace (newlines included) as one space, trimmed: one error line.
std::string one_line(std::string_view text) {
  std::string out;
  for (char c : text) {
    const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (!space) {
      out += c;
    } else if (!out.empty() && out.back() != ' ') {
      out += ' ';
    }
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// Runs `gnuplot SCRIPT` with stdout and stderr captured in files of `dir`; returns stdout.
Result<std::string> run_gnuplot(const std::string& gnuplot_script, const fs::path& dir) {
  const std::string script_path = (dir / "plot.gp").string(), out_path = (dir / "out.svg").string(),
                    err_path = (dir / "err.txt").string();
  CRESCENT_RETURN_IF_ERROR(write_file_atomically(script_path, gnuplot_script));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  char* argv[] = {const_cast<char*>("gnuplot"), const_cast<char*>(script_path.c_str()), nullptr};
  pid_t pid = 0;
  const int spawn_error = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_error == ENOENT) {
    return Status::not_found("gnuplot not found: install gnuplot-nox (scripts/install-deps.sh)");
  }
  if (spawn_error != 0) {
    return Status::internal(fmt::format("cannot run gnuplot: {}", std::strerror(spawn_error)));
  }
  int wait_status = 0;
  while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  std::string svg = read_file(out_path);
  if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0 || svg.find("<svg") == std::string::npos) {
    const std::string err = one_line(read_file(err_path));
    return Status::internal(fmt::format("gnuplot failed: {}", err.empty() ? "no SVG output" : err));
  }
  return svg;
}

}  // namespace

Result<std::string> render_svg(const Figure& figure) {
  CRESCENT_RETURN_IF_ERROR(validate(figure));
  Result<TempDir> dir = TempDir::create("crescent-plot");  // removed with gnuplot's files on return
  if (!dir.ok()) return dir.status();
  return run_gnuplot(script(figure), dir->path());
}

Result<std::string> render_svg(const Plot& plot) {
  CRESCENT_RETURN_IF_ERROR(validate(plot));  // errors name the plot alone, not a figure around it
  return render_svg(Figure{.panels = {plot}});
}

}  // namespace crescent::experiment
