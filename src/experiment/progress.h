// A progress line for long experiments, on stderr only when it is a terminal (quiet when piped), e.g.
//   [overload] run 2/4 early: 3,072/12,031 requests, 512 s simulated, ETA 3 s
// rewritten in place at most 10 times a second and cleared at the end.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "common/status_line.h"
#include "sim/simulator.h"

namespace crescent::experiment {

/// The line's text. `run` is 1-based; `eta_s` < 0 means not known yet; `time_word` says what
/// progress.simulated_s is ("simulated", or "elapsed" for a live replay).
std::string format_progress(std::string_view experiment, int run, int total_runs, std::string_view label,
                            const sim::SimProgress& progress, double eta_s,
                            std::string_view time_word = "simulated");

/// Progress of one experiment made of `total_runs` simulation runs. The ETA extrapolates the wall time
/// spent so far over the share of all runs done.
class ProgressLine {
 public:
  ProgressLine(std::string experiment, int total_runs, std::string time_word = "simulated");
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  /// Starts the next run, called `label` (a policy, a capacity), and returns the SimOptions::progress
  /// callback that reports it: empty when stderr is not a terminal. The callback refers to this object.
  std::function<void(const sim::SimProgress&)> start_run(std::string label);

 private:
  void update(const sim::SimProgress& progress);

  using Clock = std::chrono::steady_clock;
  StatusLine line_;
  std::string experiment_;
  int total_runs_;
  std::string time_word_;
  int run_ = 0;  // 1-based index of the current run
  std::string label_;
  Clock::time_point started_ = Clock::now();
};

}  // namespace crescent::experiment
