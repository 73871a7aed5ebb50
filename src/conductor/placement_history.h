// Tie-breaking between equally good instances of one pool. Without it every tie falls to instance 0: with
// idle, equal queues and no cached prefix anywhere, one prefill instance's cache would take all the traffic
// and thrash while the others stay empty. Ties go instead to the instance with the fewest requests placed
// recently, then round robin, so load and cached prefixes spread. Deterministic: no randomness, so the same
// inputs give the same placements.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "common/instance_id.h"
#include "kv/block_key.h"

namespace crescent::conductor {

/// Recent placements on the instances of one pool, and the tie-break they give. Not thread-safe.
class PlacementHistory {
 public:
  /// `half_life_s` (> 0): a placement counts 1 when made and half as much `half_life_s` seconds later.
  explicit PlacementHistory(double half_life_s = 60.0);

  /// Records that a request was placed on `instance` at `now_s` (seconds; a time before the last recorded one
  /// counts as the last one).
  void record(InstanceId instance, double now_s);

  /// Exponentially decayed count of the placements on `instance` up to `now_s` (0 for an instance never
  /// placed on). REQUIRES: now_s >= the last recorded time.
  double recent_placements(InstanceId instance, double now_s) const;

  /// Whether to choose `a` over `b` when a policy finds them equally good: `a` has had fewer recent
  /// placements, or as many and comes first counting cyclically from the instance after the last one placed
  /// on (round robin). A strict order on distinct ids; the pool size need not be known.
  bool prefer(InstanceId a, InstanceId b) const { return tie_key(a) < tie_key(b); }

  /// What prefer() compares, for loops that keep the best candidate's key: smaller is preferred.
  struct TieKey {
    double weight;
    InstanceId turn;  // cyclic distance from the instance after the last one placed on
    bool operator<(const TieKey& o) const { return weight != o.weight ? weight < o.weight : turn < o.turn; }
  };
  TieKey tie_key(InstanceId i) const {
    // Unsigned wrap-around: ids at or after next_ first, then from 0.
    return {i < weight_.size() ? weight_[i] : 0.0, static_cast<InstanceId>(i - next_)};
  }

  /// The instance round robin starts from: the one after the last placed on (0 before any).
  InstanceId round_robin_start() const { return next_; }
  /// How many placements were recorded, and how many times the weights were rescaled (which changes every
  /// weight): from these a caller keeping copies of weights (BusyOrder) knows which changed.
  uint64_t records() const { return records_; }
  uint64_t rescales() const { return rescales_; }

  /// The candidate to choose among `tied` (equally good by the policy; non-empty, distinct): the first by
  /// prefer().
  InstanceId pick(std::span<const InstanceId> tied) const;

 private:
  // Placement k at time t_k adds 2^((t_k - origin_s_) / half_life_s_) to its instance's weight, so weights
  // compare like decayed counts without touching every instance as time passes; the origin moves forward
  // (rescaling all weights) before the terms could overflow.
  double weight_of(double time_s) const;

  double half_life_s_;
  double origin_s_ = 0;
  double last_s_ = 0;
  std::vector<double> weight_;  // per instance id
  InstanceId next_ = 0;         // the instance after the last one placed on: round robin starts here
  uint64_t records_ = 0, rescales_ = 0;
};

}  // namespace crescent::conductor
