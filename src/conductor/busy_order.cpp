#include "conductor/busy_order.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>

namespace crescent::conductor {

void BusyOrder::reset(size_t instances) {
  // Room for the order and as much again, half on each side of it.
  entries_.assign(2 * instances + 2, 0);
  lo_ = hi_ = entries_.size() / 2;
  front_ = 0;
  present_.assign(instances, 0);
  in_front_.assign(instances, 0);
  busy_until_s_.assign(instances, 0.0);
  up_.assign(instances, 0);  // an up instance differs from its copy, so the next sync inserts it
  all_up_last_ = false;
  nan_count_ = 0;
  width_ = std::bit_ceil(std::max<size_t>(instances, 1));
  tree_.assign(2 * width_, kInfinity);
  nan_weights_ = 0;
  dirty_.clear();
  changes_source_ = 0;
  changes_count_ = 0;
}

void BusyOrder::set_front(InstanceId i, bool in_front, const PlacementHistory& history) {
  in_front_[i] = in_front ? 1 : 0;
  double& leaf = tree_[width_ + i];
  nan_weights_ -= std::isnan(leaf) ? 1 : 0;
  leaf = in_front ? history.tie_key(i).weight : kInfinity;
  nan_weights_ += std::isnan(leaf) ? 1 : 0;
  dirty_.push_back(i);
}

void BusyOrder::flush() {
  if (dirty_.size() > width_ / 16) {
    for (size_t n = width_ - 1; n >= 1; --n) tree_[n] = std::min(tree_[2 * n], tree_[2 * n + 1]);
  } else {
    for (const uint32_t leaf : dirty_) {
      for (size_t n = (width_ + leaf) / 2; n >= 1; n /= 2) {
        const double m = std::min(tree_[2 * n], tree_[2 * n + 1]);
        if (tree_[n] == m) break;  // an unchanged node leaves its ancestors unchanged
        tree_[n] = m;
      }
    }
  }
  dirty_.clear();
}

size_t BusyOrder::lower_bound(const Entry& e) const {
  const Entry* base = entries_.data() + lo_;
  size_t n = hi_ - lo_;
  if (n == 0) return lo_;
  while (n > 1) {
    const size_t half = n / 2;
    base = base[half] < e ? base + half : base;
    n -= half;
  }
  return static_cast<size_t>(base - entries_.data()) + (*base < e ? 1 : 0);
}

void BusyOrder::erase_at(size_t at) {
  Entry* const data = entries_.data();
  if (at - lo_ < hi_ - at - 1) {
    std::memmove(data + lo_ + 1, data + lo_, (at - lo_) * sizeof(Entry));
    ++lo_;
  } else {
    std::memmove(data + at, data + at + 1, (hi_ - at - 1) * sizeof(Entry));
    --hi_;
  }
}

size_t BusyOrder::insert(const Entry& e) {
  if (lo_ == 0 || hi_ == entries_.size()) {  // recentre: the order drifts as entries leave one end
    const size_t size = hi_ - lo_;
    const size_t lo = (entries_.size() - size) / 2;
    std::memmove(entries_.data() + lo, entries_.data() + lo_, size * sizeof(Entry));
    lo_ = lo;
    hi_ = lo + size;
  }
  Entry* const data = entries_.data();
  const size_t at = lower_bound(e);
  const size_t rank = at - lo_;
  if (rank < hi_ - at) {
    std::memmove(data + lo_ - 1, data + lo_, rank * sizeof(Entry));
    --lo_;
    data[at - 1] = e;
  } else {
    std::memmove(data + at + 1, data + at, (hi_ - at) * sizeof(Entry));
    ++hi_;
    data[at] = e;
  }
  return rank;
}

void BusyOrder::update(InstanceId i, double busy_until_s, uint8_t up, const PlacementHistory& history) {
  if (present_[i] != 0) {
    const size_t at = lower_bound(entry(busy_until_s_[i], i));
    assert(at < hi_ && id_of(entries_[at]) == i);
    // An entry of the front leaves it, which stays a prefix; one past it leaves the boundary where it is.
    if (in_front_[i] != 0) {
      set_front(i, false, history);
      --front_;
    }
    erase_at(at);
    present_[i] = 0;
  }
  nan_count_ -= std::isnan(busy_until_s_[i]) ? 1 : 0;
  nan_count_ += std::isnan(busy_until_s) ? 1 : 0;
  busy_until_s_[i] = busy_until_s;
  up_[i] = up;
  if (up == 0 || std::isnan(busy_until_s)) return;
  const size_t rank = insert(entry(busy_until_s, i));
  present_[i] = 1;
  // An entry landing ahead of the boundary (the first entry past the front) joins the front, which stays a
  // prefix; best() moves the boundary.
  if (rank <= front_) {
    set_front(i, true, history);
    ++front_;
  }
}

bool BusyOrder::sync(std::span<const double> busy_until_s, std::span<const uint8_t> up,
                     const PlacementHistory& history, const PrefillChanges& changes) {
  const size_t instances = busy_until_s.size();
  // Also forgets the change log's position. A moved-from order (its vectors empty) starts over here too.
  if (instances != busy_until_s_.size() || entries_.size() != 2 * instances + 2) reset(instances);
  const bool all_up = up.empty();
  const bool flags_as_before = all_up == all_up_last_;
  auto flag = [&](size_t i) -> uint8_t { return all_up ? 1 : up[i]; };
  const uint64_t new_changes = changes.count - changes_count_;
  if (changes.source != 0 && changes.source == changes_source_ && flags_as_before &&
      new_changes <= changes.recent.size()) {
    // The log names every instance changed since the last sync (an instance named twice compares equal the
    // second time).
    for (uint64_t c = changes_count_; c < changes.count; ++c) {
      const InstanceId i = changes.recent[c % changes.recent.size()];
      if (i < instances) compare(i, busy_until_s[i], flag(i), history);
    }
  } else {
    // Compared bit for bit (flags byte for byte) with memcmp, vectorised: the whole arrays (nothing changed
    // is common), then a block of instances at a time. A NaN then equals itself; nan_count_ remembers it.
    const bool all_same =
        flags_as_before && instances > 0 &&
        std::memcmp(busy_until_s.data(), busy_until_s_.data(), instances * sizeof(double)) == 0 &&
        (all_up || std::memcmp(up.data(), up_.data(), instances) == 0);
    constexpr size_t kBlock = 64;
    for (size_t base = 0; !all_same && base < instances; base += kBlock) {
      const size_t n = std::min(kBlock, instances - base);
      if (flags_as_before &&
          std::memcmp(&busy_until_s[base], &busy_until_s_[base], n * sizeof(double)) == 0 &&
          (all_up || std::memcmp(&up[base], &up_[base], n) == 0)) {
        continue;
      }
      for (size_t i = base; i < base + n; ++i)
        compare(static_cast<InstanceId>(i), busy_until_s[i], flag(i), history);
    }
  }
#ifndef NDEBUG
  // The log's promise, checked: the copies now equal the pool.
  for (size_t i = 0; i < instances; ++i) {
    assert(std::bit_cast<uint64_t>(busy_until_s[i]) == std::bit_cast<uint64_t>(busy_until_s_[i]));
    assert(flag(i) == up_[i]);
  }
#endif
  changes_source_ = changes.source;
  changes_count_ = changes.count;
  all_up_last_ = all_up;
  // Weights: one record since the last sync changes one instance's; more, or a rescale, any.
  if (history.rescales() != history_rescales_ || history.records() - history_records_ > 1) {
    for (size_t i = 0; i < instances; ++i) {
      if (in_front_[i] != 0) set_front(static_cast<InstanceId>(i), true, history);
    }
  } else if (history.records() != history_records_) {
    const InstanceId last = history.round_robin_start() - 1;
    if (last < instances && in_front_[last] != 0) set_front(last, true, history);
  }
  history_records_ = history.records();
  history_rescales_ = history.rescales();
  flush();  // also when unusable: the leaves written would otherwise pile up until the next best()
  return nan_count_ == 0;
}

}  // namespace crescent::conductor
