#include "experiment/plot.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string_view>

#include "common/atomic_file.h"

extern char** environ;

namespace crescent::experiment {
namespace {

namespace fs = std::filesystem;

// Okabe-Ito: distinguishable with colour-blindness, readable on white.
constexpr std::array<std::string_view, 7> kPalette{"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                                   "#E69F00", "#56B4E9", "#000000"};
// Indexed by LineStyle.
constexpr std::array<std::string_view, 3> kLineStyles{
    "linespoints dt 1 pt 7 ps 0.8 lw 2", "linespoints dt 2 pt 6 ps 0.8 lw 2", "lines dt 3 lw 1.5"};

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

Status validate(const Plot& plot) {
  if (plot.series.empty()) return Status::invalid_argument(fmt::format("plot '{}': no series", plot.title));
  for (const auto& s : plot.series) {
    const size_t expected = plot.kind == PlotKind::kBars ? plot.categories.size() : s.x.size();
    if (s.y.size() != expected) {
      return Status::invalid_argument(fmt::format("plot '{}': series '{}' has {} values, expected {}",
                                                  plot.title, s.name, s.y.size(), expected));
    }
  }
  return Status();
}

// Terminal, labels, legend and axes: what both kinds share.
std::string preamble(const Plot& plot) {
  std::string s = fmt::format(
      "set terminal svg size 900,540 dynamic noenhanced font 'sans,12' background rgb 'white'\n"
      "set encoding utf8\nset title {} font ',14'\nset xlabel {}\nset ylabel {}\n"
      "set key below height 1\nset grid ytics lc rgb '#d0d0d0' dt 3\nset tics nomirror\nset border 3\n",
      gnuplot_string(plot.title), gnuplot_string(plot.x_label), gnuplot_string(plot.y_label));
  bool right_axis = false, left_negative = false, right_negative = false;
  for (const auto& series : plot.series) {
    right_axis |= series.right_axis;
    for (double y : series.y) (series.right_axis ? right_negative : left_negative) |= y < 0;
  }
  if (right_axis) {
    s += fmt::format("set border 11\nset y2label {}\nset y2tics\n", gnuplot_string(plot.y2_label));
  }
  if (!left_negative) s += "set yrange [0:*]\n";
  if (right_axis && plot.log_y2) {
    s += "set logscale y2\n";  // values <= 0 are skipped by gnuplot
  } else if (right_axis && !right_negative) {
    s += "set y2range [0:*]\n";
  }
  return s;
}

// One element of the plot command: data `source` drawn as `series` (index `index`) in `style`.
std::string element(std::string_view source, const PlotSeries& series, size_t index, std::string_view style) {
  const size_t color = series.color < 0 ? index : static_cast<size_t>(series.color);
  return fmt::format("{} axes x1y{} title {} with {} lc rgb '{}'", source, series.right_axis ? 2 : 1,
                     gnuplot_string(series.name), style, kPalette[color % kPalette.size()]);
}

// Lines: one datablock per series. Appends the data to `script` and returns the plot elements.
std::vector<std::string> add_lines(const Plot& plot, std::string& script) {
  // x spans the data, with a margin.
  script += "set autoscale xfix\nset offsets graph 0.03, graph 0.03, 0, 0\n";
  if (plot.log_x) {
    // A tic at every x of the data (a log axis has few), in SI units: 1M, 3M, 10M.
    std::set<double> xs;
    for (const auto& series : plot.series) {
      for (double x : series.x) {
        if (std::isfinite(x) && x > 0) xs.insert(x);
      }
    }
    script += fmt::format("set logscale x\nset format x '%.0s%c'\nset xtics ({})\n", fmt::join(xs, ", "));
  }
  std::vector<std::string> elements;
  for (size_t i = 0; i < plot.series.size(); ++i) {
    const PlotSeries& series = plot.series[i];
    script += fmt::format("$s{} << EOD\n", i);
    for (size_t p = 0; p < series.y.size(); ++p) {
      script += fmt::format("{} {}\n", number(series.x[p]), number(series.y[p]));
    }
    script += "EOD\n";
    elements.push_back(
        element(fmt::format("$s{} using 1:2", i), series, i, kLineStyles[static_cast<size_t>(series.style)]));
  }
  return elements;
}

// Clustered bars: one datablock, a row per category and a column per series; each bar labelled with its
// value. Appends the settings and data to `script` and returns the plot elements.
std::vector<std::string> add_bars(const Plot& plot, std::string& script) {
  const size_t n = plot.series.size();
  std::vector<std::string> tics;
  for (size_t c = 0; c < plot.categories.size(); ++c) {
    tics.push_back(fmt::format("{} {}", gnuplot_string(plot.categories[c]), c));
  }
  script += fmt::format(
      "set style histogram clustered gap 1\nset style fill solid 0.85 border -1\n"
      "set xtics ({})\nset xrange [-0.6:{}]\n$bars << EOD\n",
      fmt::join(tics, ", "), static_cast<double>(plot.categories.size()) - 0.4);
  for (size_t c = 0; c < plot.categories.size(); ++c) {
    for (size_t i = 0; i < n; ++i) script += number(plot.series[i].y[c]) + (i + 1 < n ? " " : "\n");
  }
  script += "EOD\n";
  std::vector<std::string> elements;
  for (size_t i = 0; i < n; ++i) {
    elements.push_back(element(fmt::format("$bars using {}", i + 1), plot.series[i], i, "histograms"));
  }
  // With gap 1, bar i of a cluster is centred (i - (n-1)/2) / (n+1) off the category's tic.
  for (size_t i = 0; i < n; ++i) {
    const double offset =
        (static_cast<double>(i) - static_cast<double>(n - 1) / 2) / static_cast<double>(n + 1);
    elements.push_back(fmt::format(
        "$bars using ($0+{}):{}:(sprintf('%.3g', column({}))) axes x1y{} notitle with labels offset 0,0.7",
        offset, i + 1, i + 1, plot.series[i].right_axis ? 2 : 1));
  }
  return elements;
}

// The whole gnuplot script, data inline.
std::string script(const Plot& plot) {
  std::string s = preamble(plot);
  const std::vector<std::string> elements =
      plot.kind == PlotKind::kLines ? add_lines(plot, s) : add_bars(plot, s);
  return s + fmt::format("plot {}\n", fmt::join(elements, ", \\\n     "));
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

// A private temporary directory, removed with everything in it.
struct TempDir {
  fs::path path;
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

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

Result<std::string> render_svg(const Plot& plot) {
  CRESCENT_RETURN_IF_ERROR(validate(plot));
  std::error_code ec;
  std::string dir_template = (fs::temp_directory_path(ec) / "crescent-plot-XXXXXX").string();
  if (ec || mkdtemp(dir_template.data()) == nullptr) {
    return Status::io_error(
        fmt::format("cannot create a temporary directory: {}", ec ? ec.message() : std::strerror(errno)));
  }
  const TempDir dir{dir_template};
  return run_gnuplot(script(plot), dir.path);
}

}  // namespace crescent::experiment
