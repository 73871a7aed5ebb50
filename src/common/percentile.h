// Nearest-rank percentiles, the one definition every report in crescent uses.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace crescent {

/// The nearest-rank `percent`-th percentile (0..100) of `sorted` (ascending): the value at rank
/// ceil(percent / 100 × n), at least 1. Integer arithmetic, so p50 of 10 values is exactly the 5th.
/// T{} when `sorted` is empty.
template <typename T>
T nearest_rank(const std::vector<T>& sorted, int percent) {
  if (sorted.empty()) return T{};
  const size_t n = sorted.size();
  const size_t rank = std::max<size_t>(1, (static_cast<size_t>(percent) * n + 99) / 100);
  return sorted[std::min(rank, n) - 1];
}

}  // namespace crescent
