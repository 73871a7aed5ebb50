#include "conductor/placement_history.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace crescent::conductor {
namespace {

// Largest exponent (in half-lives since the origin) before weights are rescaled: 2^500 leaves room for
// 2^523 placements before a double overflows.
constexpr double kMaxExponent = 500;

}  // namespace

PlacementHistory::PlacementHistory(double half_life_s) : half_life_s_(half_life_s) {
  assert(half_life_s > 0);
}

double PlacementHistory::weight_of(double time_s) const {
  return std::exp2((time_s - origin_s_) / half_life_s_);
}

void PlacementHistory::record(InstanceId instance, double now_s) {
  now_s = std::max(now_s, last_s_);  // a clock that steps back counts as standing still
  if ((now_s - origin_s_) / half_life_s_ > kMaxExponent) {
    const double scale = 1 / weight_of(now_s);  // old weights may round to 0: they no longer count
    for (double& w : weight_) w *= scale;
    origin_s_ = now_s;
    ++rescales_;
  }
  if (instance >= weight_.size()) weight_.resize(static_cast<size_t>(instance) + 1, 0.0);
  weight_[instance] += weight_of(now_s);
  last_s_ = now_s;
  next_ = instance + 1;
  ++records_;
}

double PlacementHistory::recent_placements(InstanceId instance, double now_s) const {
  if (instance >= weight_.size()) return 0;
  return weight_[instance] / weight_of(now_s);
}

InstanceId PlacementHistory::pick(std::span<const InstanceId> tied) const {
  assert(!tied.empty());
  InstanceId best = tied.front();
  for (InstanceId c : tied.subspan(1)) {
    if (prefer(c, best)) best = c;
  }
  return best;
}

}  // namespace crescent::conductor
