#include "experiment/plot.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace crescent::experiment {
namespace {

namespace fs = std::filesystem;
using ::testing::AnyOf;
using ::testing::HasSubstr;
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

TEST(RenderSvg, MalformedPlotsAreRefused) {
  Plot plot = lines_plot();
  plot.series[0].y.pop_back();
  EXPECT_EQ(render_svg(plot).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(render_svg(Plot{.title = "empty"}).status().code(), StatusCode::kInvalidArgument);
  const Plot bars{.kind = PlotKind::kBars, .categories = {"a", "b"}, .series = {{.name = "s", .y = {1}}}};
  EXPECT_THAT(render_svg(bars).status().message(), HasSubstr("series 's' has 1 values, expected 2"));
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
  const fs::path dir = fs::temp_directory_path() / ("crescent_fake_gnuplot_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "gnuplot") << "#!/bin/sh\necho 'line 3: something broke' >&2\nexit 1\n";
  fs::permissions(dir / "gnuplot", fs::perms::owner_all);
  with_path(dir.string(), [] {
    const auto svg = render_svg(lines_plot());
    EXPECT_EQ(svg.status().code(), StatusCode::kInternal);
    EXPECT_EQ(svg.status().message(), "gnuplot failed: line 3: something broke");
  });
  fs::remove_all(dir);
}

}  // namespace
}  // namespace crescent::experiment
