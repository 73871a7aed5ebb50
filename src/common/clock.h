// Where "now" comes from, in seconds. Everything that keeps time (the Conductor, ClusterState, EngineCore)
// takes explicit seconds; what drives them reads a Clock: the live cluster a SteadyClock, the simulator a
// VirtualClock that it moves to each event's time. So one component runs on both.
#pragma once

#include <cassert>
#include <chrono>

namespace crescent {

/// Seconds since some start.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual double now_s() const = 0;
};

/// Real time: seconds since construction, on std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  using Steady = std::chrono::steady_clock;

  /// A clock reading 0 now.
  SteadyClock() : start_(Steady::now()) {}

  double now_s() const override { return std::chrono::duration<double>(Steady::now() - start_).count(); }
  /// The steady_clock time point of `seconds` on this clock (for waits: condition_variable::wait_until).
  /// Beyond ~31 years either way (1e9 s; infinity) it is that far, and NaN is the farthest: the clock's
  /// int64 nanoseconds end at ~292 years, and converting a double past them is undefined.
  Steady::time_point at(double seconds) const {
    constexpr double kFarthestS = 1e9;
    double s = seconds;
    if (!(s < kFarthestS)) s = kFarthestS;  // also NaN
    if (s < -kFarthestS) s = -kFarthestS;
    return start_ + std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(s));
  }

 private:
  Steady::time_point start_;
};

/// Simulated time: reads what its owner last set, starting at 0. Never goes back.
class VirtualClock final : public Clock {
 public:
  double now_s() const override { return now_s_; }
  /// Moves the clock to `t_s`. REQUIRES: t_s >= now_s() (events are handled in time order).
  void advance_to(double t_s) {
    assert(t_s >= now_s_);
    now_s_ = t_s;
  }

 private:
  double now_s_ = 0;
};

}  // namespace crescent
