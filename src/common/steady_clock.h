// The live system's clock: seconds since a start, on std::chrono::steady_clock. Everything that keeps time
// (the Conductor, ClusterState, EngineCore) takes explicit seconds, so the simulator runs them on its virtual
// clock (its event time) and the live cluster on this one.
#pragma once

#include <chrono>

namespace crescent {

class SteadyClock {
 public:
  using Clock = std::chrono::steady_clock;

  /// A clock reading 0 now.
  SteadyClock() : start_(Clock::now()) {}

  /// Seconds since construction.
  double now_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  /// The steady_clock time point of `seconds` on this clock (for waits: condition_variable::wait_until).
  Clock::time_point at(double seconds) const {
    return start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }

 private:
  Clock::time_point start_;
};

}  // namespace crescent
