#include "experiment/plot.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "test_support/temp_dir.h"

namespace crescent::experiment {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::Contains;
using ::testing::Each;
using ::testing::Ge;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Le;
using ::testing::Not;
using ::testing::StartsWith;

// A text element's content as gnuplot writes it in SVG: ">text<" with & and < escaped.
std::string svg_text(const std::string& text) {
  std::string out = ">";
  for (char c : text) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '<') {
      out += "&lt;";
    } else {
      out += c;
    }
  }
  return out += "<";
}

// The numbers among the text elements of `svg` (tic labels, and bar labels in a bar plot), in order.
// gnuplot writes a tic label as "<text> 80</text>": a leading space, then the number.
std::vector<double> numeric_labels(const std::string& svg) {
  static const std::regex text("<text>\\s*([^<]*?)\\s*</text>");
  std::vector<double> numbers;
  for (std::sregex_iterator it(svg.begin(), svg.end(), text), end; it != end; ++it) {
    const std::string label = (*it)[1].str();
    char* rest = nullptr;
    const double value = std::strtod(label.c_str(), &rest);
    if (!label.empty() && *rest == '\0') numbers.push_back(value);
  }
  return numbers;
}

bool is_whole(double v) {
  return v == std::floor(v);
}

// The part of a multiplot SVG drawn for the panel titled `title`: gnuplot draws a panel's title after its
// axes, tics and lines, so the part runs from the previous panel's title (`previous`; the start when empty)
// to this one's.
std::string panel_part(const std::string& svg, const std::string& previous, const std::string& title) {
  const size_t from = previous.empty() ? 0 : svg.find(svg_text(previous));
  const size_t to = svg.find(svg_text(title), from);
  EXPECT_NE(from, std::string::npos) << previous;
  EXPECT_NE(to, std::string::npos) << title;
  if (from == std::string::npos || to == std::string::npos) return "";
  return svg.substr(from, to - from);
}

// Where `text` is drawn: gnuplot wraps each text element in <g transform="translate(X,Y)" ...>.
std::pair<double, double> text_position(const std::string& svg, const std::string& text) {
  const size_t at = svg.find(svg_text(text));
  const size_t g = at == std::string::npos ? std::string::npos : svg.rfind("translate(", at);
  EXPECT_NE(g, std::string::npos) << text;
  if (g == std::string::npos) return {};
  double x = 0, y = 0;
  EXPECT_EQ(std::sscanf(svg.c_str() + g, "translate(%lf,%lf)", &x, &y), 2) << text;
  return {x, y};
}

// The SVG group of the plot element (series) number `n` (from 1) of panel `panel` ('a' for the first):
// gnuplot writes <g id="gnuplot_plot_1a" > with the legend entry, the line and its points, and nested
// groups, up to its matching </g>.
std::string series_group(const std::string& svg, int n, char panel = 'a') {
  const size_t from = svg.find("<g id=\"gnuplot_plot_" + std::to_string(n) + panel + "\"");
  EXPECT_NE(from, std::string::npos) << "series " << n;
  if (from == std::string::npos) return "";
  int depth = 0;
  for (size_t at = from; at < svg.size(); ++at) {
    if (svg.compare(at, 3, "<g ") == 0 || svg.compare(at, 3, "<g>") == 0) ++depth;
    if (svg.compare(at, 4, "</g>") == 0 && --depth == 0) return svg.substr(from, at + 4 - from);
  }
  ADD_FAILURE() << "series " << n << ": no end of its group";
  return "";
}

// Every match of `pattern`'s first group in `text`.
std::set<std::string> matches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  std::set<std::string> found;
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) found.insert((*it)[1]);
  return found;
}

// The point symbols a series group draws: gnuplot's svg terminal defines gpPt0, gpPt1, ... once (gnuplot
// point type N is gpPt(N-1)) and draws each point as <use xlink:href='#gpPtN' transform=...>.
std::set<std::string> point_symbols(const std::string& group) {
  return matches(group, "xlink:href='#(gpPt[0-9]+)' transform");
}

std::set<std::string> dash_patterns(const std::string& group) {
  return matches(group, "stroke-dasharray='([^']*)'");
}

Plot lines_plot() {
  return {
      .title = "hit ratio vs capacity",
      .x_label = "capacity (tokens)",
      .y_label = "hit ratio (%)",
      .log_x = true,
      .series = {{.name = "global", .x = {1e6, 1e7, 1e8}, .y = {10, 30, 37}},
                 {.name = "local", .x = {1e6, 1e7, 1e8}, .y = {2, 8, 20}, .style = LineStyle::kDashed},
                 {.name = "ceiling", .x = {1e6, 1e8}, .y = {37.4, 37.4}, .style = LineStyle::kReference}}};
}

void expect_svg(const Result<std::string>& svg) {
  ASSERT_TRUE(svg.ok()) << svg.status().message();
  EXPECT_THAT(*svg, AnyOf(StartsWith("<?xml"), StartsWith("<svg")));
  EXPECT_THAT(*svg, HasSubstr("</svg>"));
}

TEST(RenderSvg, LinesHaveTitleLabelsAndEverySeries) {
  const Plot plot = lines_plot();
  const auto svg = render_svg(plot);
  expect_svg(svg);
  for (const std::string& text : {plot.title, plot.x_label, plot.y_label}) EXPECT_THAT(*svg, HasSubstr(text));
  for (const auto& series : plot.series) EXPECT_THAT(*svg, HasSubstr(svg_text(series.name)));
  EXPECT_THAT(*svg, HasSubstr("10M")) << "log x tics in SI units";
}

TEST(RenderSvg, BarsWithASecondAxis) {
  const Plot plot{.title = "TTFT by policy",
                  .x_label = "policy",
                  .y_label = "TTFT (s)",
                  .y2_label = "requests",
                  .kind = PlotKind::kBars,
                  .categories = {"random", "cache-aware"},
                  .series = {{.name = "mean", .y = {8.9, 1.53}},
                             {.name = "rejected", .y = {120, 40}, .right_axis = true}}};
  const auto svg = render_svg(plot);
  expect_svg(svg);
  for (const char* text : {"random", "cache-aware", "mean", "rejected", "requests", "8.9", "1.53"}) {
    EXPECT_THAT(*svg, HasSubstr(text));
  }
}

TEST(RenderSvg, SpecialCharactersAreDrawnLiterally) {
  const std::vector<std::string> names = {"global-cache-aware", "tbt_slo_ms", "a^b @c &d {e} ~f",
                                          "it's \"quoted\" back\\slash <tag>", "`echo injected` $data"};
  Plot plot{.title = names[1] + " vs " + names[2], .x_label = names[0], .y_label = names[3]};
  for (const auto& name : names) plot.series.push_back({.name = name, .x = {1, 2}, .y = {1, 2}});
  const auto svg = render_svg(plot);
  expect_svg(svg);
  for (const auto& name : names) EXPECT_THAT(*svg, HasSubstr(svg_text(name))) << name;
  EXPECT_THAT(*svg, HasSubstr(svg_text(plot.title)));
}

// Statistics of nothing reach plots as NaN; a plot of nothing but NaN is drawn empty, not refused by gnuplot.
TEST(RenderSvg, PlotsOfNothingAreDrawnEmpty) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Plot bars{
      .title = "no TTFT",
      .kind = PlotKind::kBars,
      .categories = {"a", "b"},
      .series = {{.name = "mean", .y = {nan, nan}}, {.name = "p90", .y = {nan, nan}, .right_axis = true}}};
  const auto bars_svg = render_svg(bars);
  expect_svg(bars_svg);
  EXPECT_NE(bars_svg->find(">no data<"), std::string::npos);
  for (const bool log : {false, true}) {
    const Plot lines{
        .title = "no points",
        .y_from_zero = !log,
        .log_y = log,
        .series = {{.name = "s", .x = {1, 2}, .y = {nan, nan}}, {.name = "t", .x = {nan}, .y = {nan}}}};
    const auto svg = render_svg(lines);
    expect_svg(svg);
    EXPECT_NE(svg->find(">no data<"), std::string::npos);
  }
}

TEST(RenderSvg, MalformedPlotsAreRefused) {
  Plot plot = lines_plot();
  plot.series[0].y.pop_back();
  EXPECT_EQ(render_svg(plot).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(render_svg(Plot{.title = "empty"}).status().code(), StatusCode::kInvalidArgument);
  const Plot bars{.kind = PlotKind::kBars, .categories = {"a", "b"}, .series = {{.name = "s", .y = {1}}}};
  EXPECT_THAT(render_svg(bars).status().message(), HasSubstr("series 's' has 1 values, expected 2"));
}

// Three close lines over x in [1000, 3000] (far from the y values, so tic labels tell the axes apart).
Plot close_lines() {
  return {.title = "close",
          .series = {{.name = "a", .x = {1000, 2000, 3000}, .y = {80, 86, 95}},
                     {.name = "b", .x = {1000, 2000, 3000}, .y = {81, 87, 93}}}};
}

// The y tic labels of close_lines(): the numeric labels below its x.
std::vector<double> close_lines_y_tics(const std::string& svg) {
  std::vector<double> y;
  for (double v : numeric_labels(svg)) {
    if (v < 1000) y.push_back(v);
  }
  return y;
}

TEST(RenderSvg, YAxisStartsAtZeroByDefault) {
  const auto svg = render_svg(close_lines());
  expect_svg(svg);
  EXPECT_THAT(close_lines_y_tics(*svg), Contains(0.0));
}

TEST(RenderSvg, YAxisNotFromZeroZoomsToTheData) {
  Plot plot = close_lines();
  plot.y_from_zero = false;
  const auto svg = render_svg(plot);
  expect_svg(svg);
  const std::vector<double> y = close_lines_y_tics(*svg);
  EXPECT_THAT(y, Not(Contains(0.0)));
  // The data with a 5% margin: [79.25, 95.75]; gnuplot puts tics every 2 inside it.
  EXPECT_THAT(y, Each(AllOf(Ge(79.25), Le(95.75))));
  EXPECT_THAT(y, Contains(AllOf(Ge(80.0), Le(95.0))));
  EXPECT_GE(y.size(), 5u) << "tics close enough to tell the lines apart";
}

TEST(RenderSvg, YAxisNotFromZeroOnTheRightAxisToo) {
  Plot plot = close_lines();
  plot.y_from_zero = false;
  plot.series.push_back({.name = "requests", .x = {1000, 3000}, .y = {5000, 5300}, .right_axis = true});
  const auto svg = render_svg(plot);
  expect_svg(svg);
  const std::vector<double> labels = numeric_labels(*svg);
  EXPECT_THAT(labels, Not(Contains(0.0)));
  EXPECT_THAT(labels, Contains(AllOf(Ge(5000.0), Le(5300.0)))) << "a right-axis tic within its data";
}

// A series spanning 0.2 to 4000 on x in [1, 3].
Plot orders_of_magnitude(std::string title) {
  return {.title = std::move(title), .series = {{.name = "queue", .x = {1, 2, 3}, .y = {0.2, 30, 4000}}}};
}

TEST(RenderSvg, LogYHasDecadeTics) {
  Plot plot = orders_of_magnitude("log");
  plot.log_y = true;
  const auto svg = render_svg(plot);
  expect_svg(svg);
  const std::vector<double> labels = numeric_labels(*svg);
  for (double decade : {0.1, 1.0, 10.0, 100.0, 1000.0}) EXPECT_THAT(labels, Contains(decade));
  EXPECT_THAT(labels, Not(Contains(0.0))) << "a log axis cannot start at 0";
  EXPECT_THAT(labels, Not(Contains(500.0))) << "no linear tics";

  const auto linear = render_svg(orders_of_magnitude("linear"));
  expect_svg(linear);
  EXPECT_THAT(numeric_labels(*linear), AllOf(Contains(0.0), Not(Contains(0.1))));
}

TEST(RenderSvg, ZoomedLogYWithinOneDecadeStillHasLabelledTics) {
  const Plot plot{.title = "one decade",
                  .y_from_zero = false,
                  .log_y = true,
                  .series = {{.name = "s", .x = {1, 2, 3}, .y = {1.53, 4, 8.9}}}};
  const auto svg = render_svg(plot);
  expect_svg(svg);
  EXPECT_THAT(numeric_labels(*svg), AllOf(Contains(1.0), Contains(10.0)));
}

TEST(RenderSvg, IntegerXTicsAreWholeNumbers) {
  // Over 1..3, gnuplot's own tics include 1.5 and 2.5; y values are whole and far above 3.
  Plot plot{.title = "instances", .series = {{.name = "s", .x = {1, 2, 3}, .y = {100, 300, 200}}}};
  const auto plain = render_svg(plot);
  expect_svg(plain);
  EXPECT_THAT(numeric_labels(*plain), Contains(2.5)) << "the case integer_x is for";

  plot.integer_x = true;
  const auto svg = render_svg(plot);
  expect_svg(svg);
  EXPECT_THAT(numeric_labels(*svg), Each(::testing::Truly(is_whole)));
  for (double x : {1.0, 2.0, 3.0}) EXPECT_THAT(numeric_labels(*svg), Contains(x));
  EXPECT_THAT(*svg, Not(HasSubstr(">1.0<"))) << "printed without decimals";

  // Prefill instances 1..15: a tic at each.
  plot.series[0].x.clear();
  plot.series[0].y.clear();
  for (int i = 1; i <= 15; ++i) {
    plot.series[0].x.push_back(i);
    plot.series[0].y.push_back(100 + 10 * i);
  }
  const auto fifteen = render_svg(plot);
  expect_svg(fifteen);
  const std::vector<double> labels = numeric_labels(*fifteen);
  EXPECT_THAT(labels, Each(::testing::Truly(is_whole)));
  for (int i = 1; i <= 15; ++i) EXPECT_THAT(labels, Contains(static_cast<double>(i)));
}

// Counts on the left axis (rejected requests): whole-number tics even when the counts are small.
TEST(RenderSvg, IntegerYHasWholeNumberTics) {
  Plot plot{.title = "rejections",
            .kind = PlotKind::kBars,
            .categories = {"none", "slo"},
            .series = {{.name = "rejected", .y = {0, 3}}}};
  const auto plain = render_svg(plot);
  expect_svg(plain);
  EXPECT_THAT(numeric_labels(*plain), Contains(0.5)) << "the case integer_y is for";
  plot.integer_y = true;
  const auto svg = render_svg(plot);
  expect_svg(svg);
  EXPECT_THAT(numeric_labels(*svg), Each(::testing::Truly(is_whole)));
}

TEST(RenderSvg, IntegerXOverAWideRangeHasAtMost15Tics) {
  const Plot plot{
      .title = "wide", .integer_x = true, .series = {{.name = "s", .x = {0, 1000}, .y = {0.25, 0.75}}}};
  const auto svg = render_svg(plot);
  expect_svg(svg);
  std::set<double> x;  // the labels above y's range (y tics are 0 to 0.8)
  for (double v : numeric_labels(*svg)) {
    if (v >= 1) x.insert(v);
  }
  EXPECT_EQ(x, (std::set<double>{100, 200, 300, 400, 500, 600, 700, 800, 900, 1000}));
}

TEST(RenderSvg, LineSeriesHaveDistinctPointsAndDashes) {
  Plot plot{.title = "overlapping"};
  for (int i = 0; i < 4; ++i) {
    plot.series.push_back({.name = std::string(1, static_cast<char>('a' + i)),
                           .x = {1, 2, 3},
                           .y = {1, 2, 3},  // all on top of each other
                           .style = i < 2 ? LineStyle::kSolid : LineStyle::kDashed,
                           .color = 0});  // one colour: only markers and dashes tell them apart
  }
  plot.series.push_back({.name = "ceiling", .x = {1, 3}, .y = {3, 3}, .style = LineStyle::kReference});
  const auto svg = render_svg(plot);
  expect_svg(svg);
  std::set<std::string> seen;
  for (int n = 1; n <= 4; ++n) {
    const std::set<std::string> symbols = point_symbols(series_group(*svg, n));
    ASSERT_EQ(symbols.size(), 1u) << "series " << n << " draws one point symbol";
    EXPECT_TRUE(seen.insert(*symbols.begin()).second) << "series " << n << " repeats " << *symbols.begin();
  }
  EXPECT_THAT(dash_patterns(series_group(*svg, 1)), IsEmpty()) << "solid";
  const std::set<std::string> dashes3 = dash_patterns(series_group(*svg, 3)),
                              dashes4 = dash_patterns(series_group(*svg, 4));
  ASSERT_EQ(dashes3.size(), 1u);
  ASSERT_EQ(dashes4.size(), 1u);
  EXPECT_NE(*dashes3.begin(), *dashes4.begin());
  const std::string reference = series_group(*svg, 5);
  EXPECT_THAT(point_symbols(reference), IsEmpty()) << "no markers on a reference line";
  const std::set<std::string> dotted = dash_patterns(reference);
  ASSERT_EQ(dotted.size(), 1u);
  EXPECT_NE(*dotted.begin(), *dashes3.begin());
  EXPECT_NE(*dotted.begin(), *dashes4.begin());
}

TEST(RenderSvg, NotesAreDrawnLiterallyOnEitherAxis) {
  Plot plot = close_lines();
  plot.series.push_back({.name = "queue", .x = {1000, 3000}, .y = {1, 100}, .right_axis = true});
  plot.log_y2 = true;
  plot.notes = {{.x = 2500, .y = 90, .text = "decode HBM full at 850 s"},
                {.x = 1200, .y = 10, .text = "a^b {c} <d> & 'e'", .right_axis = true}};
  const auto svg = render_svg(plot);
  expect_svg(svg);
  for (const auto& note : plot.notes) EXPECT_THAT(*svg, HasSubstr(svg_text(note.text)));
}

TEST(RenderSvg, MalformedNotesAreRefused) {
  Plot plot = close_lines();
  plot.notes = {{.x = std::nan(""), .y = 1, .text = "nowhere"}};
  EXPECT_THAT(render_svg(plot).status().message(), HasSubstr("note 'nowhere'"));
  plot.notes = {{.x = 1000, .y = 1, .text = "right", .right_axis = true}};
  const auto svg = render_svg(plot);
  EXPECT_EQ(svg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(svg.status().message(), HasSubstr("note 'right' is on the right axis, but no series is"));
}

TEST(RenderSvg, APlotIsAFigureOf900x540) {
  const auto svg = render_svg(lines_plot());
  expect_svg(svg);
  EXPECT_THAT(*svg, HasSubstr("viewBox=\"0 0 900 540\""));
}

// A 2x2 figure: a log-y panel, the same data on a linear axis, integer x, and bars.
Figure two_by_two() {
  Plot log = orders_of_magnitude("panel 1: log"), linear = orders_of_magnitude("panel 2: linear");
  log.log_y = true;
  log.notes = {{.x = 2, .y = 30, .text = "a note in panel 1"}};
  return {.title = "The whole figure",
          .panels = {log,
                     linear,
                     {.title = "panel 3: instances",
                      .integer_x = true,
                      .series = {{.name = "s", .x = {1, 2, 3}, .y = {100, 300, 200}}}},
                     {.title = "panel 4: bars",
                      .kind = PlotKind::kBars,
                      .categories = {"random", "cache-aware"},
                      .series = {{.name = "mean", .y = {8.9, 1.53}}}}},
          .columns = 2,
          .width_px = 1400,
          .height_px = 900};
}

TEST(RenderSvgFigure, PanelsAreLaidOutInRowsAndColumns) {
  const Figure figure = two_by_two();
  const auto svg = render_svg(figure);
  expect_svg(svg);
  EXPECT_THAT(*svg, HasSubstr("viewBox=\"0 0 1400 900\""));
  EXPECT_THAT(*svg, HasSubstr(svg_text(figure.title)));
  std::vector<std::pair<double, double>> at;
  for (const Plot& panel : figure.panels) at.push_back(text_position(*svg, panel.title));
  // A panel's title is centred over its axes, whose left edge depends on its tic labels' width.
  for (size_t i : {0, 2}) EXPECT_LT(at[i].first, 700) << "panel " << i + 1 << " in the left column";
  for (size_t i : {1, 3}) EXPECT_GT(at[i].first, 700) << "panel " << i + 1 << " in the right column";
  for (size_t i : {0, 1}) EXPECT_LT(at[i].second, 450) << "panel " << i + 1 << " in the top row";
  for (size_t i : {2, 3}) EXPECT_GT(at[i].second, 450) << "panel " << i + 1 << " in the bottom row";
  EXPECT_EQ(at[0].second, at[1].second);
  EXPECT_EQ(at[2].second, at[3].second);
  EXPECT_LT(text_position(*svg, figure.title).second, at[0].second) << "the figure's title above all";
  for (const char* text : {"random", "cache-aware", "8.9", "1.53"}) EXPECT_THAT(*svg, HasSubstr(text));
}

TEST(RenderSvgFigure, PanelSettingsDoNotCarryOver) {
  const Figure figure = two_by_two();
  const auto svg = render_svg(figure);
  expect_svg(svg);
  const std::string log = panel_part(*svg, "", figure.panels[0].title),
                    linear = panel_part(*svg, figure.panels[0].title, figure.panels[1].title),
                    instances = panel_part(*svg, figure.panels[1].title, figure.panels[2].title);
  EXPECT_THAT(numeric_labels(log), AllOf(Contains(0.1), Contains(1000.0), Not(Contains(0.0))));
  EXPECT_THAT(log, HasSubstr(svg_text("a note in panel 1")));
  EXPECT_THAT(numeric_labels(linear), AllOf(Contains(0.0), Contains(2.5), Not(Contains(0.1))))
      << "panel 2: linear y from 0, gnuplot's own x tics";
  EXPECT_THAT(linear, Not(HasSubstr(svg_text("a note in panel 1"))));
  EXPECT_THAT(numeric_labels(instances), Each(::testing::Truly(is_whole)));
  const std::string bars = svg->substr(svg->find(svg_text(figure.panels[2].title)));
  EXPECT_THAT(numeric_labels(bars), AllOf(Contains(0.0), Contains(8.9))) << "panel 4: bars from 0";
}

TEST(RenderSvgFigure, MalformedFiguresAreRefused) {
  const auto empty = render_svg(Figure{.title = "nothing"});
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.status().message(), "figure 'nothing': no panels");

  Figure figure = two_by_two();
  figure.columns = 0;
  EXPECT_EQ(render_svg(figure).status().code(), StatusCode::kInvalidArgument);
  figure = two_by_two();
  figure.height_px = 0;
  EXPECT_EQ(render_svg(figure).status().code(), StatusCode::kInvalidArgument);

  figure = two_by_two();
  figure.panels[1].series[0].y.pop_back();
  const auto bad_panel = render_svg(figure);
  EXPECT_EQ(bad_panel.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_panel.status().message(),
            "figure 'The whole figure', panel 2: plot 'panel 2: linear': series 'queue' has 2 values, "
            "expected 3");
  figure = two_by_two();
  figure.panels[3].series.clear();
  EXPECT_THAT(render_svg(figure).status().message(), HasSubstr("panel 4: plot 'panel 4: bars': no series"));
}

// Runs `body` with PATH set to `path`.
template <typename Body>
void with_path(const std::string& path, Body body) {
  const char* original = std::getenv("PATH");
  const std::string saved = original != nullptr ? original : "";
  setenv("PATH", path.c_str(), 1);
  body();
  setenv("PATH", saved.c_str(), 1);
}

TEST(RenderSvg, MissingGnuplotNamesThePackage) {
  with_path("/nonexistent", [] {
    const auto svg = render_svg(lines_plot());
    EXPECT_EQ(svg.status().code(), StatusCode::kNotFound);
    EXPECT_EQ(svg.status().message(), "gnuplot not found: install gnuplot-nox (scripts/install-deps.sh)");
  });
}

TEST(RenderSvg, FailingGnuplotReportsItsErrorOutput) {
  const test::TempDir temp("crescent-fake-gnuplot");
  const fs::path dir = temp.path();
  std::ofstream(dir / "gnuplot") << "#!/bin/sh\necho 'line 3: something broke' >&2\nexit 1\n";
  fs::permissions(dir / "gnuplot", fs::perms::owner_all);
  with_path(dir.string(), [] {
    const auto svg = render_svg(lines_plot());
    EXPECT_EQ(svg.status().code(), StatusCode::kInternal);
    EXPECT_EQ(svg.status().message(), "gnuplot failed: line 3: something broke");
  });
}

}  // namespace
}  // namespace crescent::experiment
