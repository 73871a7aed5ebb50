// The prefill instances in order of busy_until, kept from one decision to the next, so Algorithm 1 need not
// score every instance when most of them share one local prefix length (docs/benchmarks.md, "Conductor
// decisions"): among instances alike but for their queue, the lowest TTFT is the least busy one's.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "common/instance_id.h"
#include "conductor/cluster_view.h"
#include "conductor/placement_history.h"

namespace crescent::conductor {

/// The up instances of one pool ordered by (busy_until, id), kept current by comparing the pool's state with
/// copies taken at the last sync; and a min-tree of the tie-break weights (PlacementHistory) over a prefix of
/// that order, the front. best() answers "the preferred instance with the lowest score among a group" from the
/// order's first members and the tree, without a pass over the pool. Not thread-safe.
class BusyOrder {
 public:
  /// Brings the order up to date with a pool of busy_until_s.size() instances: `busy_until_s` (seconds, per
  /// instance), `up` (per instance: 0 down, any other value up; empty: all up) and `history`, the pool's
  /// tie-break. `changes` is the pool's change log (ClusterView::prefill_changes): when it is the log of the
  /// last sync's pool, still holds every change since, and the pool's size and flags' form (empty or not)
  /// are as at the last sync, only the instances it names are compared with their copies; otherwise (no
  /// log, another log, more changes than it keeps) every instance is.
  /// Costs those compares plus, per instance whose busy_until or flag changed since the last sync, a binary
  /// search and a move of the entries on the shorter side of its old and new places in the order (16 bytes
  /// each, at most half the pool; and, after about half the pool's size in updates, a move of the whole order
  /// back to the middle of its room); and O(log instances) per instance whose weight changed. All of them
  /// change the first time or when the pool's size changed; all weights when more than one placement was
  /// recorded (or the weights rescaled) since. False when the order cannot be used: some instance's
  /// busy_until (up or down) is NaN.
  bool sync(std::span<const double> busy_until_s, std::span<const uint8_t> up,
            const PlacementHistory& history, const PrefillChanges& changes = {});

  /// An instance and its score (in the caller's unit: seconds for the Conductor's TTFT estimates).
  struct Best {
    InstanceId instance;
    double score;
  };

  /// Among the up instances `i` with member(i), those with the lowest score(busy_until_s[i]), and among them
  /// the one history.prefer() chooses (the same `history` as the last sync, unchanged since). `score` must be
  /// non-decreasing in busy_until and is evaluated exactly as given, so ties by rounding are found as a loop
  /// over the instances would find them. None when no up instance is a member. Costs O(k) for the k
  /// non-members ahead of the first member in the order, O(log instances) for each instance entering or
  /// leaving the front, and about O(log instances) for the tree (more when non-members hold the least
  /// weights). REQUIRES: sync() returned true.
  template <typename Member, typename Score>
  std::optional<Best> best(Member member, Score score, const PlacementHistory& history);

 private:
  static constexpr double kInfinity = std::numeric_limits<double>::infinity();
  // One up instance in the order: its busy_until's bits, mapped so that their unsigned order is the doubles'
  // (-0 as 0; never NaN), above its id. One unsigned compare then orders by (busy_until, id), without the
  // branches of comparing doubles then ids.
  using Entry = unsigned __int128;
  static Entry entry(double busy_until_s, InstanceId id) {
    auto bits = std::bit_cast<uint64_t>(busy_until_s + 0.0);  // -0 + 0 is +0
    bits = (bits >> 63) != 0 ? ~bits : bits | (uint64_t{1} << 63);
    return (Entry{bits} << 64) | id;
  }
  static InstanceId id_of(Entry e) { return static_cast<InstanceId>(e); }

  void reset(size_t instances);
  // Updates instance `i` if its busy_until (bit for bit) or flag differs from its copy.
  void compare(InstanceId i, double busy_until_s, uint8_t up, const PlacementHistory& history) {
    if (std::bit_cast<uint64_t>(busy_until_s) != std::bit_cast<uint64_t>(busy_until_s_[i]) || up != up_[i]) {
      update(i, busy_until_s, up, history);
    }
  }
  // Moves instance `i` to its new state (erasing and re-inserting it in the order); `up` is its flag (0: down).
  void update(InstanceId i, double busy_until_s, uint8_t up, const PlacementHistory& history);
  // The first of entries_[lo_, hi_) not below `e` (binary search without branches on the comparison).
  size_t lower_bound(const Entry& e) const;
  // Removes entries_[at], moving the shorter side of the order over it.
  void erase_at(size_t at);
  // Inserts `e` at its place; returns its rank (entries ahead of it).
  size_t insert(const Entry& e);
  // Puts instance `i` in or out of the front; its tree leaf is written, the leaf's ancestors at flush().
  void set_front(InstanceId i, bool in_front, const PlacementHistory& history);
  void flush();
  // The leftmost leaf holding `least`. REQUIRES: least == tree_[1].
  InstanceId leftmost_holding(double least) const {
    size_t node = 1;
    while (node < width_) node = 2 * node + (tree_[2 * node] == least ? 0 : 1);
    return static_cast<InstanceId>(node - width_);
  }
  // Lowers `least` to the least member leaf below `node` if smaller (branch and bound).
  template <typename Member>
  void least_weight(size_t node, double& least, Member& member) const;
  // The first member leaf holding `least` with id >= `from` (none if none).
  template <typename Member>
  std::optional<InstanceId> first_with(InstanceId from, double least, Member& member) const;

  // The order: entries_[lo_, hi_), sorted, with free room on both sides, so an entry is erased or inserted
  // by moving the entries on its shorter side (an instance placed on leaves the front for the back: few
  // move). Recentred when an insert finds either side full.
  std::vector<Entry> entries_;
  size_t lo_ = 0, hi_ = 0;
  size_t front_ = 0;                         // the front: the first front_ entries of the order
  std::vector<uint8_t> present_;             // per instance: in the order (up and busy_until not NaN)
  std::vector<uint8_t> in_front_;            // per instance
  std::vector<double> busy_until_s_;         // per instance: at the last sync
  std::vector<uint8_t> up_;                  // per instance: its flag at the last sync (1 when all up; 0 before)
  bool all_up_last_ = false;                 // the last sync's flags were empty (all up)
  size_t nan_count_ = 0;                     // instances whose busy_until is NaN
  size_t width_ = 0;                         // leaves in the tree: a power of two >= instances
  std::vector<double> tree_;                 // tree_[width_ + i]: instance i's weight if in front, else inf;
                                             // tree_[n] = min(tree_[2n], tree_[2n + 1])
  std::vector<uint32_t> dirty_;              // leaves written since the last flush()
  size_t nan_weights_ = 0;                   // leaves holding a NaN weight (the searches below then decide)
  uint64_t history_records_ = 0, history_rescales_ = 0;  // the history's counters at the last sync
  uint64_t changes_source_ = 0, changes_count_ = 0;      // the change log's at the last sync (0: none)
};

template <typename Member>
void BusyOrder::least_weight(size_t node, double& least, Member& member) const {
  if (!(tree_[node] < least)) return;
  if (node >= width_) {
    if (member(static_cast<InstanceId>(node - width_))) least = tree_[node];
    return;
  }
  size_t first = 2 * node;
  size_t second = first + 1;
  if (tree_[second] < tree_[first]) std::swap(first, second);
  least_weight(first, least, member);
  least_weight(second, least, member);
}

template <typename Member>
std::optional<InstanceId> BusyOrder::first_with(InstanceId from, double least, Member& member) const {
  if (from >= width_) return std::nullopt;
  size_t node = width_ + from;
  while (true) {
    if (tree_[node] <= least) {
      while (node < width_) node = tree_[2 * node] <= least ? 2 * node : 2 * node + 1;  // the leftmost such leaf
      const auto id = static_cast<InstanceId>(node - width_);
      if (tree_[node] == least && member(id)) return id;
    }
    // On to the subtree right after this one: up while a right child, then its right sibling.
    while ((node & 1) != 0) {
      node >>= 1;
      if (node <= 1) return std::nullopt;  // was the rightmost subtree
    }
    ++node;
  }
}

template <typename Member, typename Score>
std::optional<BusyOrder::Best> BusyOrder::best(Member member, Score score, const PlacementHistory& history) {
  const Entry* const order = entries_.data() + lo_;
  const size_t size = hi_ - lo_;
  // Scored from the copy of busy_until, bit for bit (an entry's bits map -0 to 0).
  auto score_at = [&](size_t rank) { return score(busy_until_s_[id_of(order[rank])]); };
  size_t first = 0;
  while (first < size && !member(id_of(order[first]))) ++first;
  if (first == size) return std::nullopt;
  const double lowest = score_at(first);
  if (std::isnan(lowest)) return std::nullopt;
  // The front becomes the entries scoring <= lowest: a prefix of the order, as score is monotone. Members in
  // it score exactly `lowest` (the first member's is the least), so they are the tied ones.
  while (front_ < size && score_at(front_) <= lowest) {
    set_front(id_of(order[front_]), true, history);
    ++front_;
  }
  while (front_ > 0 && !(score_at(front_ - 1) <= lowest)) {
    set_front(id_of(order[front_ - 1]), false, history);
    --front_;
  }
  flush();
  // PlacementHistory::prefer: the least weight, then the first from the round robin's start, cyclically.
  // Usually the leftmost leaf holding the least weight of all, found by a descent without branches on the
  // tree's values, is a member's. Then it is the answer if it is at or past the start; if it is before, the
  // answer is the first member leaf holding that weight from the start on (one search), or else it. When a
  // non-member holds the least (or a leaf a NaN weight), searches from the start and, if none from there,
  // from 0 find the first member leaf holding the least; only when no member holds it does a branch and
  // bound find the members' least.
  const InstanceId start = history.round_robin_start();
  if (const double least = tree_[1]; nan_weights_ == 0 && least < kInfinity) {
    const InstanceId leftmost = leftmost_holding(least);
    if (member(leftmost)) {
      if (leftmost >= start) return Best{leftmost, lowest};
      const auto from_start = first_with(start, least, member);
      return Best{from_start ? *from_start : leftmost, lowest};
    }
  }
  // The first member leaf holding `least` from the round robin's start, cyclically.
  auto cyclic_first = [&](double least) {
    auto id = first_with(start, least, member);
    return id || start == 0 ? id : first_with(0, least, member);
  };
  std::optional<InstanceId> id = cyclic_first(tree_[1]);
  if (!id) {
    double least = kInfinity;
    least_weight(1, least, member);
    id = cyclic_first(least);
  }
  if (!id)
    return std::nullopt;  // unreachable: the first member is in the front, so a member leaf holds least
  return Best{*id, lowest};
}

}  // namespace crescent::conductor
