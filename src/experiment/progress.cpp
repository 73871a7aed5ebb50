#include "experiment/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "common/text_format.h"

namespace crescent::experiment {
namespace {

// 12031 -> "12,031". REQUIRES: n >= 0.

}  // namespace

std::string format_progress(std::string_view experiment, int run, int total_runs, std::string_view label,
                            const sim::SimProgress& progress, double eta_s, std::string_view time_word) {
  return fmt::format("[{}] run {}/{} {}: {}/{} requests, {:.0f} s {}, ETA {}", experiment, run, total_runs,
                     label, grouped(progress.requests_arrived), grouped(progress.requests_total),
                     progress.simulated_s, time_word, eta_s < 0 ? "?" : fmt::format("{:.0f} s", eta_s));
}

ProgressLine::ProgressLine(std::string experiment, int total_runs, std::string time_word)
    : experiment_(std::move(experiment)),
      total_runs_(total_runs),
      time_word_(std::move(time_word)) {}

std::function<void(const sim::SimProgress&)> ProgressLine::start_run(std::string label) {
  ++run_;
  label_ = std::move(label);
  if (!line_.enabled()) return nullptr;
  return [this](const sim::SimProgress& progress) { update(progress); };
}

void ProgressLine::update(const sim::SimProgress& progress) {
  if (!line_.due()) return;
  const auto now = Clock::now();
  const double run_done = progress.requests_total > 0 ? static_cast<double>(progress.requests_arrived) /
                                                            static_cast<double>(progress.requests_total)
                                                      : 0;
  const double done = (run_ - 1 + run_done) / total_runs_;
  const double elapsed_s = std::chrono::duration<double>(now - started_).count();
  const double eta_s = done > 0 ? elapsed_s * (1 - done) / done : -1;
  line_.draw(format_progress(experiment_, run_, total_runs_, label_, progress, eta_s, time_word_));
}

}  // namespace crescent::experiment
