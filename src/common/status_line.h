// One line of progress on stderr, rewritten in place, only when stderr is a terminal (quiet when piped or
// redirected): the experiment's progress line and the import's progress bar draw through it.
#pragma once

#include <chrono>
#include <string_view>

namespace crescent {

/// A line redrawn at most 10 times a second and cleared when destroyed.
class StatusLine {
 public:
  StatusLine();
  /// Clears the line if it was drawn.
  ~StatusLine();
  StatusLine(const StatusLine&) = delete;
  StatusLine& operator=(const StatusLine&) = delete;

  /// Whether stderr is a terminal (else draw() does nothing).
  bool enabled() const { return enabled_; }
  /// Whether draw() would draw now (enabled, and 100 ms since the last drawing): lets callers skip
  /// formatting a line that would not be shown.
  bool due() const;
  /// Replaces the line with `text` when due().
  void draw(std::string_view text);
  /// Erases the line (before other output on stderr; a later draw() shows it again).
  void clear();

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point last_drawn_{};
};

}  // namespace crescent
